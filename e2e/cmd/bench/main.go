// Command bench measures Loom at fleet size on the simulated cluster and
// prints one table (package e2e/bench): ClusterPolicy apply to Ready, the
// large gang's pods per second, RayClusters to ready, the manager's API
// requests by phase and per idle minute, its RSS and heap, and the node
// agent's RSS and CPU per collection.
//
//	go run ./e2e/cmd/bench                # 1,000 nodes (make bench)
//	go run ./e2e/cmd/bench --nodes 5000   # needs more than the 2-core CI machine
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/loom-dev/loom/e2e/bench"
	"github.com/loom-dev/loom/e2e/framework"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := bench.Config{}
	flag.IntVar(&cfg.Nodes, "nodes", 1000, "simulated 8-GPU nodes")
	flag.IntVar(&cfg.Agents, "agents", 5, "nodes whose inventory comes from a real node-agent process (measured); the benchmark publishes the rest")
	flag.DurationVar(&cfg.AgentInterval, "agent-interval", 5*time.Second, "the measured agents' collection interval")
	flag.IntVar(&cfg.GangPods, "gang", 512, "pods of the large TrainingJob (1 GPU each)")
	flag.IntVar(&cfg.SmallJobs, "jobs", 8, "small TrainingJobs (2 pods × 8 GPUs)")
	flag.IntVar(&cfg.RayClusters, "rayclusters", 20, "RayClusters of 1 head + 3 workers")
	flag.IntVar(&cfg.BackgroundPods, "background-pods", 2400, "other pods in the cluster (with the defaults, 10,000 pods in all)")
	flag.DurationVar(&cfg.Idle, "idle", 60*time.Second, "idle window after everything settled")
	loomBin := flag.String("loom", "", "loom binary (default: build ./cmd/manager)")
	flag.Func("manager-env", "KEY=VALUE for the manager's environment (repeatable), e.g. GOGC=50", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want KEY=VALUE, got %q", v)
		}
		cfg.ManagerEnv = append(cfg.ManagerEnv, v)
		return nil
	})
	flag.Parse()
	cfg.ManagerArgs = flag.Args()
	if cfg.Nodes > 1000 && runtime.NumCPU() < 8 {
		fmt.Fprintf(os.Stderr, "bench: %d nodes on %d CPUs: the simulated control plane (API server, scheduler, kwok), "+
			"not Loom, bounds the rollout and gang timings at this size; the manager's memory and API requests still hold\n",
			cfg.Nodes, runtime.NumCPU())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
	}
	c, err := framework.Start(ctx, framework.Options{Logf: logf, KeepDir: os.Getenv("LOOM_E2E_KEEP") != ""})
	if err != nil {
		return err
	}
	defer c.Stop()
	if *loomBin == "" {
		if *loomBin, err = framework.BuildLoom(c.Dir); err != nil {
			return err
		}
	}
	if err := bench.Prepare(ctx, c, &cfg, logf); err != nil {
		return err
	}
	rel, err := c.InstallChart(ctx, "loom", "loom-system")
	if err != nil {
		return err
	}
	r, err := bench.Run(ctx, c, *loomBin, rel, cfg, logf)
	if err != nil {
		return err
	}
	logf("done in %s", time.Since(t0).Round(time.Second))
	return r.Print(os.Stdout)
}
