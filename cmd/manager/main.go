// Command loom is Loom's manager binary. Subcommands:
//
//	loom manager     the controller manager (every reconciler)
//	loom version     prints the version this binary was built as
//
// and, hidden, "loom uninstall-cleanup", the chart's pre-delete hook. The
// node agent is a binary of its own, loom-node-agent (cmd/node-agent): it
// needs cgo and NVML, which this binary leaves out, so that it builds
// static and the manager maps less of itself into memory.
//
// Run "loom <subcommand> -h" for its flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/controllers/clusterpolicy"
	"github.com/loom-dev/loom/controllers/driverupgrade"
	"github.com/loom-dev/loom/controllers/monitoring"
	"github.com/loom-dev/loom/controllers/nodelabels"
	"github.com/loom-dev/loom/controllers/raycluster"
	"github.com/loom-dev/loom/controllers/rayjob"
	"github.com/loom-dev/loom/controllers/training"
	"github.com/loom-dev/loom/internal/cli"
	"github.com/loom-dev/loom/internal/manager"
)

// registry lists the controllers built into this binary. Adding a controller
// is one line here; the controller's package holds all its logic.
func registry() *manager.Registry {
	reg := &manager.Registry{}
	reg.Add("gpu-labels", nodelabels.Setup)
	reg.Add("clusterpolicy", clusterpolicy.Setup)
	reg.Add("driver-upgrade", driverupgrade.Setup)
	reg.Add("trainingjob", training.Setup)
	reg.Add("raycluster", raycluster.Setup)
	reg.Add("rayjob", rayjob.Setup)
	reg.Add("monitoring", monitoring.Setup)
	reg.AddOff("monitoring", monitoring.Off)
	return reg
}

func main() {
	os.Exit(run(ctrl.SetupSignalHandler(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprintf(stderr, "usage: loom <subcommand> [flags]\n\nsubcommands:\n  manager     run the controller manager\n"+
			"  version     print the version\n\n(the node agent is the loom-node-agent binary)\n")
	}
	if len(args) == 0 {
		usage()
		return 2
	}
	switch args[0] {
	case "manager":
		return runManager(ctx, args[1:], stdout, stderr)
	case "node-agent":
		fmt.Fprintln(stderr, "loom: the node agent is its own binary, loom-node-agent, in the same image (flags as before)")
		return 2
	case "uninstall-cleanup":
		return runCleanup(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "loom", manager.Version())
		return 0
	case "-h", "--help", "help":
		usage()
		return 0
	default:
		fmt.Fprintf(stderr, "loom: unknown subcommand %q\n", args[0])
		usage()
		return 2
	}
}

// managerGCPercent is the manager's GOGC unless the environment sets one. Its
// heap is mostly caches that change slowly and its CPU is idle most of the
// time, so it collects at 50% heap growth instead of Go's 100% (the README's
// fleet benchmark figures compare the two).
const managerGCPercent = 50

// setGCPercent applies managerGCPercent unless GOGC is set.
func setGCPercent(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(managerGCPercent)
	}
}

// setMemProfileRate turns the heap profiler's sampling off when nothing
// can read its profile: with --pprof-bind-address off (the default) the
// samples' hash table and stack buckets (1.5-2 MiB resident at 100
// RayClusters) are memory no one uses. GODEBUG=memprofilerate, when set,
// is kept.
func setMemProfileRate(pprofAddr string, getenv func(string) string) {
	if (pprofAddr == "" || pprofAddr == "0") && !strings.Contains(getenv("GODEBUG"), "memprofilerate=") {
		runtime.MemProfileRate = 0
	}
}

func runManager(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loom manager", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := manager.DefaultOptions()
	opts.BindFlags(fs)
	var common cli.Common
	common.Bind(fs)
	if code, done := cli.Parse(fs, &common, args, stdout); done {
		return code
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintf(stderr, "loom manager: %v\n", err)
		return 2
	}
	reg := registry()
	// Fail on a bad --controllers before touching the cluster.
	if _, err := reg.Select(opts.Controllers); err != nil {
		fmt.Fprintf(stderr, "loom manager: %v\n", err)
		return 2
	}
	cli.SetupLogging(opts.LogLevel, opts.LogFormat, stderr)
	log := ctrl.Log.WithName("setup")
	log.Info("loom manager", "version", manager.Version())
	setGCPercent(os.Getenv)
	setMemProfileRate(opts.PprofAddr, os.Getenv)

	cfg, err := common.RestConfig()
	if err != nil {
		fmt.Fprintf(stderr, "loom manager: cannot load a kubeconfig or in-cluster config: %v\n", err)
		return 1
	}
	if opts.ApplyCRDs {
		if err := applyCRDs(ctx, cfg); err != nil {
			log.Error(err, "cannot bring Loom's CRDs up to this build's (--apply-crds=false skips this)")
			return 1
		}
	}
	mgr, selected, err := manager.New(ctx, cfg, opts, reg)
	if err != nil {
		log.Error(err, "cannot build the manager")
		return 1
	}
	log.Info("starting manager", "version", manager.Version(), "controllers", selected, "namespace", opts.Namespace,
		"watchNamespaces", opts.WatchNamespaces, "leaderElection", opts.LeaderElect)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped with an error")
		return 1
	}
	log.Info("manager stopped")
	return 0
}

// applyCRDs applies Loom's CRDs when the cluster's are older than this
// build's.
func applyCRDs(ctx context.Context, cfg *rest.Config) error {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "loom-manager"
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		return err
	}
	_, err = manager.EnsureCRDs(ctx, cfg, c, manager.Version(), ctrl.Log.WithName("crds"))
	return err
}
