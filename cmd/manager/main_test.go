package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/loom-dev/loom/internal/manager"
)

func TestCommandLine(t *testing.T) {
	tests := []struct {
		args     []string
		wantCode int
		wantErr  string
	}{
		{args: nil, wantCode: 2, wantErr: "usage: loom <subcommand>"},
		{args: []string{"bogus"}, wantCode: 2, wantErr: `unknown subcommand "bogus"`},
		{args: []string{"manager", "--controllers=bogus"}, wantCode: 2, wantErr: `unknown controller(s) "bogus" in --controllers; `},
		{args: []string{"manager", "--max-concurrent-reconciles=0"}, wantCode: 2, wantErr: "--max-concurrent-reconciles must be at least 1"},
		{args: []string{"manager", "--no-such-flag"}, wantCode: 2, wantErr: "flag provided but not defined: -no-such-flag"},
		{args: []string{"manager", "-h"}, wantCode: 0, wantErr: "-kube-api-qps"},
		{args: []string{"manager", "-h"}, wantCode: 0, wantErr: "-kubeconfig"},
		{args: []string{"manager", "--kubeconfig", "/no/such/kubeconfig", "--version"}, wantCode: 0, wantErr: "loom " + manager.Version()},
		{args: []string{"node-agent", "--once"}, wantCode: 2, wantErr: "its own binary, loom-node-agent"},
		{args: []string{"version"}, wantCode: 0, wantErr: "loom " + manager.Version()},
		{args: []string{"uninstall-cleanup", "-h"}, wantCode: 0, wantErr: "-manager-deployment"},
		{args: []string{"manager", "--kubeconfig", "/no/such/kubeconfig", "--controllers=gpu-labels"}, wantCode: 1, wantErr: "/no/such/kubeconfig"},
		// Go's flag package stops at the first argument that is not a flag:
		// a boolean given as "--flag value" would turn it on and drop every
		// flag after it without a word.
		{args: []string{"manager", "--leader-elect", "false", "--kube-api-qps=50"}, wantCode: 2, wantErr: `unexpected argument "false"`},
		{args: []string{"manager", "--leader-elect", "false"}, wantCode: 2, wantErr: "(--leader-elect=false)"},
		{args: []string{"uninstall-cleanup", "stray"}, wantCode: 2, wantErr: `unexpected argument "stray"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(context.Background(), tt.args, &stderr, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantErr, stderr.String())
			}
		})
	}
}

// The manager collects at 50% heap growth unless GOGC says otherwise.
func TestManagerGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	setGCPercent(func(string) string { return "" })
	if got := debug.SetGCPercent(150); got != managerGCPercent {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, managerGCPercent)
	}
	// 150 stands for what the runtime read from GOGC=150.
	setGCPercent(func(k string) string { return map[string]string{"GOGC": "150"}[k] })
	if got := debug.SetGCPercent(100); got != 150 {
		t.Errorf("GOGC=150: GC percent %d, want 150 kept", got)
	}
}

// Heap-profile sampling is off unless the pprof endpoint is on or GODEBUG
// sets a rate.
func TestManagerMemProfileRate(t *testing.T) {
	defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
	none := func(string) string { return "" }
	for _, tt := range []struct {
		addr, godebug string
		want          int
	}{
		{"", "", 0},
		{"0", "", 0},
		{"127.0.0.1:6060", "", 512 * 1024},
		{"", "memprofilerate=1", 512 * 1024},
	} {
		runtime.MemProfileRate = 512 * 1024
		getenv := none
		if tt.godebug != "" {
			getenv = func(k string) string { return map[string]string{"GODEBUG": tt.godebug}[k] }
		}
		setMemProfileRate(tt.addr, getenv)
		if runtime.MemProfileRate != tt.want {
			t.Errorf("pprof %q, GODEBUG %q: MemProfileRate %d, want %d", tt.addr, tt.godebug, runtime.MemProfileRate, tt.want)
		}
	}
}

// The manager's binary links neither NVML nor go-nvml's mock servers
// (whose tables are built at start) nor the node agent: they are
// loom-node-agent's alone, and the manager builds without cgo.
func TestManagerLinksNoNVML(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/NVIDIA/go-nvml/", "github.com/loom-dev/loom/internal/collect", "github.com/loom-dev/loom/internal/agent"} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("the manager links %s", pkg)
			}
		}
	}
}

// The chart's schema refuses at install a --controllers value the manager
// would refuse at start (a crash loop instead of an error from helm): it
// accepts "all" and every list of the registered names, nothing else.
func TestChartSchemaKnowsTheControllers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "charts", "loom", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Manager struct {
				Properties struct {
					Controllers struct {
						Pattern string `json:"pattern"`
					} `json:"controllers"`
				} `json:"properties"`
			} `json:"manager"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	re, err := regexp.Compile(schema.Properties.Manager.Properties.Controllers.Pattern)
	if err != nil {
		t.Fatalf("manager.controllers pattern: %v", err)
	}
	names := registry().Names()
	accepted := append([]string{"all", "*", strings.Join(names, ","), names[0] + ", " + names[1]}, names...)
	for _, v := range accepted {
		if _, err := registry().Select(v); err != nil {
			t.Fatalf("the manager refuses %q: %v", v, err)
		}
		if !re.MatchString(v) {
			t.Errorf("the chart's schema refuses manager.controllers=%q, which the manager runs", v)
		}
	}
	for _, v := range []string{"training", "trainingjob,ray", "all,bogus", "trainingjob;rayjob"} {
		if re.MatchString(v) {
			t.Errorf("the chart's schema accepts manager.controllers=%q", v)
		}
	}
}
