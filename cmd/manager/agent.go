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
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
)

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loom node-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default: $NODE_NAME, from the downward API)")
	interval := fs.Duration("interval", 60*time.Second, "time between collections; NVML events trigger extra ones")
	once := fs.Bool("once", false, "print the inventory as JSON and exit (needs no cluster)")
	simulate := fs.String("simulate", "", "simulate a system on go-nvml's mock servers instead of real NVML: "+strings.Join(inventory.SimulatedSystemNames(), "|"))
	simGPUs := fs.Int("simulate-gpus", 8, "GPUs of the simulated system")
	simMIG := fs.String("simulate-mig", "", "put simulated GPUs in MIG mode with these devices, e.g. 1g.5gb:7 or 3g.20gb:1,2g.10gb:2")
	metricsAddr := fs.String("metrics-bind-address", ":8090", "address of /metrics and /healthz; \"0\" disables")
	logLevel := fs.String("log-level", "info", "log level: debug, info, error or a verbosity number")
	logFormat := fs.String("log-format", "json", "log format: json or text")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if _, err := manager.ParseLogLevel(*logLevel); err != nil {
		fmt.Fprintf(stderr, "loom node-agent: %v\n", err)
		return 2
	}
	if *interval < time.Second {
		fmt.Fprintf(stderr, "loom node-agent: --interval must be at least 1s, got %s\n", *interval)
		return 2
	}
	if !*once && *nodeName == "" {
		fmt.Fprintln(stderr, "loom node-agent: --node-name (or $NODE_NAME) is required")
		return 2
	}
	setupLogging(*logLevel, *logFormat, stderr)
	log := ctrl.Log.WithName("node-agent").WithValues("node", *nodeName)

	var lib nvml.Interface
	if *simulate != "" {
		sim, err := inventory.Simulate(inventory.SimOptions{System: *simulate, GPUs: simGPUs, MIG: *simMIG, Seed: *nodeName})
		if err != nil {
			fmt.Fprintf(stderr, "loom node-agent: --simulate: %v\n", err)
			return 2
		}
		lib = sim
		log.Info("SIMULATED: GPUs come from go-nvml's mock server, not from hardware", "system", *simulate, "gpus", *simGPUs, "mig", *simMIG)
	} else {
		lib = nvml.New()
	}

	if *once {
		return printOnce(lib, *simulate, stdout, stderr)
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "cannot load a kubeconfig or in-cluster config")
		return 1
	}
	cfg.UserAgent = "loom-node-agent"
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		log.Error(err, "cannot build a client")
		return 1
	}
	metrics := agent.NewMetrics()
	if *metricsAddr != "0" {
		defer serveAgentMetrics(*metricsAddr, metrics, log)()
	}
	a := &agent.Agent{NodeName: *nodeName, Lib: lib, Client: c, Log: log, Interval: *interval, Simulated: *simulate, Metrics: metrics}
	if err := a.Run(ctx); err != nil {
		log.Error(err, "node agent stopped")
		return 1
	}
	log.Info("node agent stopped")
	return 0
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

func printOnce(lib nvml.Interface, simulated string, stdout, stderr io.Writer) int {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		fmt.Fprintf(stderr, "loom node-agent: NVML unavailable: %s\n", nvml.ErrorString(ret))
		return 1
	}
	defer func() { _ = lib.Shutdown() }()
	st, err := inventory.Collect(lib, nil)
	if err != nil {
		fmt.Fprintf(stderr, "loom node-agent: %v\n", err)
		return 1
	}
	st.Simulated = simulated
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(st); err != nil {
		return 1
	}
	return 0
}
