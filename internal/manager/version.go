package manager

import (
	"runtime/debug"
)

// version is Loom's version, stamped at build:
//
//	go build -ldflags "-X github.com/loom-dev/loom/internal/manager.buildVersion=v0.4.0" ./cmd/manager
//
// (make build and the Dockerfile do). Unstamped, Version falls back to the
// module version or VCS revision Go recorded, then to "dev".
var buildVersion = ""

// Version is the version this binary was built as.
func Version() string {
	if buildVersion != "" {
		return buildVersion
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return "dev-" + s.Value[:12]
		}
	}
	return "dev"
}
