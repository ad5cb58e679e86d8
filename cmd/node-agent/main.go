// Command loom-node-agent publishes this node's GPUs, from the PCI bus and
// through NVML, as its GPUNode's status: the chart's DaemonSet on GPU nodes.
// It is apart from the manager's binary (loom) because NVML needs cgo;
// the manager builds static and without it.
//
//	loom-node-agent [flags]        run until stopped
//	loom-node-agent --once         print one reading as JSON and exit
//	loom-node-agent --simulate=S   simulate a system on go-nvml's mock servers
//
// Run "loom-node-agent -h" for its flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/agent"
	"github.com/loom-dev/loom/internal/cli"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
)

// agentFlags are loom-node-agent's flags.
type agentFlags struct {
	nodeName, sysfsRoot, driverRoot  string
	sysfsRootSet                     bool
	interval                         time.Duration
	once                             bool
	simulate, simMIG, simMIGFile     string
	simGPUs                          int
	simBare, simHost                 bool
	metricsAddr, logLevel, logFormat string
	common                           cli.Common
}

func parseAgentFlags(args []string, stdout, stderr io.Writer) (*agentFlags, int) {
	f := &agentFlags{}
	fs := flag.NewFlagSet("loom-node-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default: $NODE_NAME, from the downward API)")
	fs.DurationVar(&f.interval, "interval", 60*time.Second, "time between collections; NVML events trigger extra ones")
	fs.BoolVar(&f.once, "once", false, "print the inventory (PCI and NVML) as JSON and exit (needs no cluster)")
	fs.StringVar(&f.sysfsRoot, "sysfs-root", "/sys", "sysfs to read the PCI bus from (<root>/bus/pci/devices)")
	fs.StringVar(&f.driverRoot, "driver-root", "", "root of the driver's files; libnvidia-ml.so.1 is loaded from its usr/lib64, "+
		"usr/lib/x86_64-linux-gnu or usr/lib/aarch64-linux-gnu (default: "+strings.Join(agent.DefaultDriverRoots, ", then ")+
		", then the dynamic loader's search path)")
	fs.StringVar(&f.simulate, "simulate", "", "simulate a system on go-nvml's mock servers instead of real NVML: "+strings.Join(collect.SimulatedSystemNames(), "|"))
	fs.IntVar(&f.simGPUs, "simulate-gpus", 8, "GPUs of the simulated system")
	fs.StringVar(&f.simMIG, "simulate-mig", "", "put simulated GPUs in MIG mode with these devices, e.g. 1g.5gb:7 or 3g.20gb:1,2g.10gb:2")
	fs.StringVar(&f.simMIGFile, "simulate-mig-file", "", "before each collection, apply the MIG layout in this file to the simulated GPUs "+
		"(a spec per GPU per line, or one line for all; a spec as --simulate-mig takes, or \"disabled\")")
	fs.BoolVar(&f.simBare, "simulate-bare", false, "simulate a node without a loaded driver: NVML fails until "+
		"<driver-root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 exists (needs --driver-root)")
	fs.BoolVar(&f.simHost, "simulate-host-driver", false, "simulate a driver installed on the host: NVML works from the start, "+
		"and the GPUNode's status.driver.source says Host (as for a real host driver)")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8090", "address of /metrics and /healthz; \"0\" disables")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error or a verbosity number")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or text")
	f.common.Bind(fs)
	if code, done := cli.Parse(fs, &f.common, args, stdout); done {
		return nil, code
	}
	fs.Visit(func(fl *flag.Flag) { f.sysfsRootSet = f.sysfsRootSet || fl.Name == "sysfs-root" })
	return f, f.validate(stderr)
}

func (f *agentFlags) validate(stderr io.Writer) int {
	var msg string
	if _, err := manager.ParseLogLevel(f.logLevel); err != nil {
		msg = err.Error()
	}
	switch {
	case msg != "":
	case f.logFormat != "json" && f.logFormat != "text":
		msg = fmt.Sprintf("--log-format must be json or text, got %q", f.logFormat)
	case f.interval < time.Second:
		msg = fmt.Sprintf("--interval must be at least 1s, got %s", f.interval)
	case !f.once && f.nodeName == "":
		msg = "--node-name (or $NODE_NAME) is required"
	case f.simulate == "" && (f.simBare || f.simHost || f.simMIGFile != "" || f.simMIG != ""):
		msg = "--simulate-bare, --simulate-host-driver, --simulate-mig and --simulate-mig-file need --simulate"
	case f.simBare && f.simHost:
		msg = "--simulate-bare and --simulate-host-driver exclude each other: a bare node gets Loom's driver"
	case f.simBare && f.driverRoot == "":
		msg = "--simulate-bare needs --driver-root (where the simulated driver's library appears)"
	}
	if msg != "" {
		fmt.Fprintf(stderr, "loom-node-agent: %s\n", msg)
		return 2
	}
	return 0
}

func main() {
	os.Exit(run(ctrl.SetupSignalHandler(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, code := parseAgentFlags(args, stdout, stderr)
	if f == nil || code != 0 {
		return code
	}
	cli.SetupLogging(f.logLevel, f.logFormat, stderr)
	log := ctrl.Log.WithName("node-agent").WithValues("node", f.nodeName)
	log.Info("loom-node-agent", "version", manager.Version())
	lib, before, cleanup, err := agentLibrary(f, log)
	if err != nil {
		fmt.Fprintf(stderr, "loom-node-agent: %v\n", err)
		return 2
	}
	defer cleanup()
	if f.once {
		return printOnce(lib, f.sysfsRoot, f.simulate, before, stdout, stderr)
	}
	cfg, err := f.common.RestConfig()
	if err != nil {
		log.Error(err, "cannot load a kubeconfig or in-cluster config")
		return 1
	}
	cfg.UserAgent = "loom-node-agent"
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		log.Error(err, "cannot build a client")
		return 1
	}
	metrics := agent.NewMetrics()
	if f.metricsAddr != "0" {
		defer serveAgentMetrics(f.metricsAddr, metrics, log)()
	}
	// A simulation's NVML needs no device node.
	unprivileged := f.simulate == "" && agent.RunsUnprivileged()
	a := &agent.Agent{NodeName: f.nodeName, Lib: lib, Client: c, Log: log, Interval: f.interval, Simulated: f.simulate,
		Metrics: metrics, SysfsRoot: f.sysfsRoot, BeforeCollect: before, Unprivileged: unprivileged}
	if err := a.Run(ctx); err != nil {
		log.Error(err, "node agent stopped")
		return 1
	}
	log.Info("node agent stopped")
	return 0
}

// agentLibrary is NVML: from the driver root, or simulated. A simulation
// without --sysfs-root gets a fabricated PCI bus of its GPUs in a temporary
// directory (f.sysfsRoot is set to it) that cleanup removes.
func agentLibrary(f *agentFlags, log logr.Logger) (nvml.Interface, func() error, func(), error) {
	if f.simulate == "" {
		return agent.NewDriverLibrary(f.driverRoot), nil, func() {}, nil
	}
	sim, err := collect.Simulate(collect.SimOptions{System: f.simulate, GPUs: &f.simGPUs, MIG: f.simMIG, Seed: f.nodeName,
		Bare: f.simBare, HostDriver: f.simHost, DriverRoot: f.driverRoot, MIGFile: f.simMIGFile})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--simulate: %w", err)
	}
	cleanup := func() {}
	if !f.sysfsRootSet {
		dir, err := os.MkdirTemp("", "loom-simulated-sysfs-")
		if err != nil {
			return nil, nil, nil, err
		}
		cleanup = func() { _ = os.RemoveAll(dir) }
		if err := inventory.WritePCITree(dir, sim.PCIDevices()); err != nil {
			cleanup()
			return nil, nil, nil, fmt.Errorf("writing the simulated PCI bus: %w", err)
		}
		f.sysfsRoot = dir
	}
	log.Info("SIMULATED: GPUs come from go-nvml's mock server, not from hardware", "system", f.simulate, "gpus", f.simGPUs,
		"mig", f.simMIG, "migFile", f.simMIGFile, "bare", f.simBare, "hostDriver", f.simHost, "driverRoot", f.driverRoot, "sysfsRoot", f.sysfsRoot)
	return sim, sim.ReloadMIG, cleanup, nil
}

// serveAgentMetrics serves /metrics and /healthz on addr until the
// returned function is called.
func serveAgentMetrics(addr string, metrics *agent.Metrics, log logr.Logger) func() {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "metrics server")
		}
	}()
	return func() { _ = srv.Close() }
}

// printOnce prints one reading of the node as JSON: the PCI GPUs and, when
// NVML works, its inventory; NVML unavailable is in the conditions and
// still exits 0. It fails only when nothing could be read.
func printOnce(lib nvml.Interface, sysfsRoot, simulated string, before func() error, stdout, stderr io.Writer) int {
	st, warn, err := agent.Once(lib, sysfsRoot, simulated, before)
	if warn != nil {
		fmt.Fprintf(stderr, "loom-node-agent: %v\n", warn)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if encErr := enc.Encode(st); encErr != nil {
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "loom-node-agent: nothing could be read: %v\n", err)
		return 1
	}
	return 0
}
