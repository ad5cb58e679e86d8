// Command demo runs Loom on a local simulated GPU cluster: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kwok built from
// source, a few simulated GPU nodes, the chart installed with helm, and the
// manager running locally under the chart's service account. It prints a
// kubeconfig for kubectl and runs until Ctrl-C, then stops every process it
// started.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/loom-dev/loom/e2e/framework"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	loomBin := flag.String("loom", "", "loom binary (default: build ./cmd/manager)")
	gpuNodes := flag.Int("gpu-nodes", 3, "simulated GPU nodes")
	gpus := flag.Int("gpus", 8, "GPUs per GPU node")
	product := flag.String("product", "NVIDIA-H100-80GB-HBM3", "GPU product of the GPU nodes")
	cpuNodes := flag.Int("cpu-nodes", 1, "simulated CPU-only nodes")
	dir := flag.String("dir", "", "directory for the cluster's data and logs (default: a new temporary directory, removed on exit)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	logf := func(format string, args ...any) {
		fmt.Printf("[%5.1fs] %s\n", time.Since(started).Seconds(), fmt.Sprintf(format, args...))
	}

	logf("building tools if needed (the first run compiles Kubernetes from source: ~20 min on 2 cores)")
	cluster, err := framework.Start(ctx, framework.Options{Dir: *dir, Logf: logf})
	if err != nil {
		return err
	}
	defer func() {
		logf("stopping %d processes", len(cluster.Processes()))
		cluster.Stop()
		logf("stopped; nothing left running")
	}()

	if *loomBin == "" {
		if *loomBin, err = framework.BuildLoom(cluster.Dir); err != nil {
			return err
		}
	} else if *loomBin, err = filepath.Abs(*loomBin); err != nil {
		return err
	}
	if *gpuNodes > 0 {
		names, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "gpu-node", Count: *gpuNodes, GPUs: *gpus, Product: *product})
		if err != nil {
			return err
		}
		logf("%d GPU nodes Ready (%d x %s each): %v", len(names), *gpus, *product, names)
	}
	if *cpuNodes > 0 {
		names, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "cpu-node", Count: *cpuNodes})
		if err != nil {
			return err
		}
		logf("%d CPU nodes Ready: %v", len(names), names)
	}

	const ns = "loom-system"
	rel, err := cluster.InstallChart(ctx, "loom", ns)
	if err != nil {
		return err
	}
	logf("chart installed: release %s in %s", rel.Name, ns)
	m, err := cluster.RunManager(ctx, *loomBin, rel, "--log-format=text")
	if err != nil {
		return err
	}
	if err := cluster.WaitReady(ctx, m, ns, "loom-manager", 2*time.Minute); err != nil {
		return err
	}
	logf("manager ready and leading (PID %d, as service account %s/%s)", m.PID(), ns, rel.ServiceAccount)

	fmt.Printf(`
Loom is running on a simulated cluster.

  export KUBECONFIG=%s
  %s get nodes -L nvidia.com/gpu.product
  %s -n %s get lease loom-manager

The chart's manager pods in %s are simulated by kwok; the real manager runs
here as PID %d under the chart's service account. Logs of every process:
  %s/*.log

Press Ctrl-C to stop everything.
`, cluster.Kubeconfig, cluster.Kubectl(), cluster.Kubectl(), ns, ns, m.PID(), cluster.Dir)

	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Println()
			return nil
		case <-tick.C:
			if err := cluster.Check(); err != nil {
				return fmt.Errorf("a process of the simulated cluster died: %w", err)
			}
		}
	}
}
