package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
)

// nvmlSession is the agent's NVML state: initialised (up, with its event
// watcher), or down with the reason and the time of the next attempt.
type nvmlSession struct {
	up         bool
	down       *nvmlFailure // why NVML is unavailable; nil while up or before the first attempt
	backoff    time.Duration
	nextInit   time.Time
	stopEvents func()
}

// nvmlFailure is why NVML is unavailable: the condition reason
// (NVMLInitFailed, NVMLLost) and NVML's own words.
type nvmlFailure struct {
	reason, message string
}

// ensureNVML initialises NVML when it is down and the backoff has passed.
func (a *Agent) ensureNVML() {
	if a.nvml.up || time.Now().Before(a.nvml.nextInit) {
		return
	}
	ret := a.Lib.Init()
	if ret != nvml.SUCCESS {
		msg := nvml.ErrorString(ret)
		a.Metrics.errors.WithLabelValues("nvml_init").Inc()
		a.nvml.down = &nvmlFailure{reason: gpuv1alpha1.ReasonNVMLInitFailed, message: msg}
		if a.Unprivileged {
			a.nvml.down.reason = gpuv1alpha1.ReasonUnprivileged
		}
		a.scheduleInit()
		a.Log.Error(errors.New(msg), "NVML is unavailable; keeping the last inventory and retrying", "retryIn", a.nvml.backoff)
		return
	}
	if a.nvml.down != nil {
		a.Log.Info("NVML is available again")
	}
	a.nvml = nvmlSession{up: true}
	ctx, cancel := context.WithCancel(a.ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.watchEvents(ctx) }()
	a.nvml.stopEvents = func() { cancel(); <-done }
}

// scheduleInit sets the next initialisation attempt: 1 s, doubling, at most
// Interval apart.
func (a *Agent) scheduleInit() {
	a.nvml.backoff = min(max(2*a.nvml.backoff, time.Second), max(a.Interval, time.Second))
	a.nvml.nextInit = time.Now().Add(a.nvml.backoff)
}

// nvmlRetry fires when NVML is due for another initialisation; nil (never)
// while it is up.
func (a *Agent) nvmlRetry() <-chan time.Time {
	if a.nvml.up {
		return nil
	}
	return time.After(time.Until(a.nvml.nextInit))
}

// loseNVML ends an NVML session whose calls began failing: the event
// watcher stops, NVML is shut down, and initialisation is retried.
func (a *Agent) loseNVML(err error) {
	a.Log.Error(err, "NVML calls are failing (driver unloaded?); keeping the last inventory and initialising NVML again")
	a.stopNVML()
	a.nvml.down = &nvmlFailure{reason: gpuv1alpha1.ReasonNVMLLost, message: err.Error()}
	a.scheduleInit()
}

// stopNVML stops the event watcher and shuts NVML down, if it is up.
func (a *Agent) stopNVML() {
	if !a.nvml.up {
		return
	}
	a.nvml.stopEvents()
	if ret := a.Lib.Shutdown(); ret != nvml.SUCCESS {
		a.Log.Info("NVML shutdown failed", "reason", nvml.ErrorString(ret))
	}
	a.nvml = nvmlSession{}
}

// nvmlGone reports whether err is NVML saying that the driver or the
// library is not there (any more), rather than one call failing.
func nvmlGone(err error) bool {
	var ne *collect.NVMLError
	if !errors.As(err, &ne) {
		return false
	}
	return collect.DriverGone(ne.Ret)
}

// ContainerDriverRoot is a containerised driver's root (GPU Operator's and
// Loom's driver operand install there); HostRoot is the host's root as the
// chart mounts it.
const (
	ContainerDriverRoot = "/run/nvidia/driver"
	HostRoot            = "/host"
)

// DefaultDriverRoots are where a driver's files are looked for, in order: a
// containerised driver's root, then the host's.
var DefaultDriverRoots = []string{ContainerDriverRoot, HostRoot}

// nvmlLibDirs are the library directories of the distributions' layouts.
var nvmlLibDirs = []string{"usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu"}

// FindNVML returns the first libnvidia-ml.so.1 under the roots' library
// directories, or "".
func FindNVML(roots []string) string {
	for _, root := range roots {
		for _, dir := range nvmlLibDirs {
			p := filepath.Join(root, dir, "libnvidia-ml.so.1")
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	return ""
}

// DriverLibrary is NVML loaded from a driver root. The library is looked up
// again at every Init, since a containerised driver appears (and is
// replaced) while the agent runs.
type DriverLibrary struct {
	nvml.Interface
	roots   []string
	loader  bool // with no library under the roots, let the dynamic loader find one
	path    string
	created bool
}

// NewDriverLibrary loads NVML from root (<root>/usr/lib64,
// <root>/usr/lib/x86_64-linux-gnu, <root>/usr/lib/aarch64-linux-gnu); with
// root "", from the first of DefaultDriverRoots that has it, else wherever
// the dynamic loader finds libnvidia-ml.so.1.
func NewDriverLibrary(root string) *DriverLibrary {
	l := &DriverLibrary{Interface: nvml.New(), roots: []string{root}}
	if root == "" {
		l.roots, l.loader = DefaultDriverRoots, true
	}
	return l
}

// Init finds the library and initialises it.
func (l *DriverLibrary) Init() nvml.Return {
	path := FindNVML(l.roots)
	if path == "" && !l.loader {
		return nvml.ERROR_LIBRARY_NOT_FOUND
	}
	if !l.created || path != l.path {
		var opts []nvml.LibraryOption
		if path != "" {
			opts = append(opts, nvml.WithLibraryPath(path))
		}
		l.Interface, l.path, l.created = nvml.New(opts...), path, true
	}
	return l.Interface.Init()
}

// Path is the library Init loaded last ("" for the dynamic loader's).
func (l *DriverLibrary) Path() string { return l.path }

// Source is where the driver of the library Init loaded last comes from
// (see driverSource).
func (l *DriverLibrary) Source() gpuv1alpha1.DriverSource {
	return driverSource(l.path, FindNVML([]string{ContainerDriverRoot}) != "")
}

// driverSource is where the driver whose NVML is at path comes from:
// Container under a containerised driver's root; Host under the host's
// root while no containerised driver's root holds a library (one appearing
// there since NVML was loaded is a driver container coming up: the host's
// kernel then holds a driver that may well be the container's); "" when
// it cannot be told (the dynamic loader's library, another root).
func driverSource(path string, containerRoot bool) gpuv1alpha1.DriverSource {
	switch {
	case under(path, ContainerDriverRoot):
		return gpuv1alpha1.DriverContainer
	case under(path, HostRoot) && !containerRoot:
		return gpuv1alpha1.DriverHost
	}
	return ""
}

// under reports whether path lies under dir.
func under(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}
