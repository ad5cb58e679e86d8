// Command loom is Loom's one binary. Subcommands:
//
//	loom manager     the controller manager (every reconciler)
//	loom node-agent  publishes this node's GPUs (NVML) as its GPUNode status
//
// Run "loom <subcommand> -h" for its flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/loom-dev/loom/controllers/clusterpolicy"
	"github.com/loom-dev/loom/controllers/driverupgrade"
	"github.com/loom-dev/loom/controllers/monitoring"
	"github.com/loom-dev/loom/controllers/nodelabels"
	"github.com/loom-dev/loom/controllers/raycluster"
	"github.com/loom-dev/loom/controllers/training"
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
	reg.Add("monitoring", monitoring.Setup)
	return reg
}

func main() {
	os.Exit(run(ctrl.SetupSignalHandler(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprintf(stderr, "usage: loom <subcommand> [flags]\n\nsubcommands:\n  manager     run the controller manager\n  node-agent  publish this node's GPU inventory (NVML) as its GPUNode\n")
	}
	if len(args) == 0 {
		usage()
		return 2
	}
	switch args[0] {
	case "manager":
		return runManager(ctx, args[1:], stderr)
	case "node-agent":
		return runAgent(ctx, args[1:], stdout, stderr)
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

func runManager(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("loom manager", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := manager.DefaultOptions()
	opts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
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
	setupLogging(opts.LogLevel, opts.LogFormat, stderr)
	log := ctrl.Log.WithName("setup")
	setGCPercent(os.Getenv)

	cfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "cannot load a kubeconfig or in-cluster config")
		return 1
	}
	mgr, selected, err := manager.New(ctx, cfg, opts, reg)
	if err != nil {
		log.Error(err, "cannot build the manager")
		return 1
	}
	log.Info("starting manager", "controllers", selected, "namespace", opts.Namespace,
		"watchNamespaces", opts.WatchNamespaces, "leaderElection", opts.LeaderElect)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped with an error")
		return 1
	}
	log.Info("manager stopped")
	return 0
}

func setupLogging(logLevel, logFormat string, w io.Writer) {
	level, _ := manager.ParseLogLevel(logLevel) // validated already
	zopts := []zap.Opts{zap.WriteTo(w), zap.Level(level), zap.StacktraceLevel(zapcore.PanicLevel)}
	if logFormat == "text" {
		zopts = append(zopts, zap.ConsoleEncoder())
	} else {
		zopts = append(zopts, zap.JSONEncoder())
	}
	ctrl.SetLogger(zap.New(zopts...))
}
