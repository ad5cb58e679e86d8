// Command bench-gpu-stack measures the ClusterPolicy reconciler on the
// simulated cluster: N GPU nodes, a default ClusterPolicy, time from apply
// to Ready, and the manager's API requests (by verb and resource) during the
// rollout and during an idle window afterwards.
//
//	go run ./e2e/cmd/bench-gpu-stack --nodes 500 --idle 60s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench-gpu-stack: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	nodes := flag.Int("nodes", 500, "simulated GPU nodes")
	idle := flag.Duration("idle", 60*time.Second, "idle window measured after Ready")
	loomBin := flag.String("loom", "", "loom binary (default: build ./cmd/manager)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
	}
	cluster, err := framework.Start(ctx, framework.Options{Logf: logf})
	if err != nil {
		return err
	}
	defer cluster.Stop()
	if *loomBin == "" {
		if *loomBin, err = framework.BuildLoom(cluster.Dir); err != nil {
			return err
		}
	}
	// The nodes carry nvidia.com/gpu.present themselves (as GFD or an earlier
	// Loom would have set it): this measures the GPU stack, not the agents.
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "gpu", Count: *nodes, GPUs: 8,
		Labels: map[string]string{"nvidia.com/gpu.present": "true"}}); err != nil {
		return err
	}
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "cpu", Count: 2}); err != nil {
		return err
	}
	logf("%d GPU nodes Ready", *nodes)
	rel, err := cluster.InstallChart(ctx, "loom", "loom-system", "nodeAgent.enabled=false")
	if err != nil {
		return err
	}
	m, err := cluster.RunManager(ctx, *loomBin, rel)
	if err != nil {
		return err
	}
	if err := cluster.WaitReady(ctx, m, "loom-system", "loom-manager", 2*time.Minute); err != nil {
		return err
	}
	token := cluster.Config.BearerToken
	before, err := m.APIRequests(token)
	if err != nil {
		return err
	}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	applied := time.Now()
	if err := cluster.Client.Create(ctx, cp); err != nil {
		return err
	}
	for {
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			return err
		}
		if cp.Status.State == gpuv1alpha1.PolicyReady {
			break
		}
		if err := cluster.Check(); err != nil {
			return err
		}
		if time.Since(applied) > 15*time.Minute {
			return fmt.Errorf("not Ready after 15m: %+v", cp.Status.Conditions)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ready := time.Since(applied)
	logf("ClusterPolicy Ready after %s", ready.Round(10*time.Millisecond))
	busy, err := m.APIRequests(token)
	if err != nil {
		return err
	}
	time.Sleep(*idle)
	after, err := m.APIRequests(token)
	if err != nil {
		return err
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "GPU nodes\t%d\n", *nodes)
	fmt.Fprintf(w, "ClusterPolicy apply -> Ready\t%s\n", ready.Round(10*time.Millisecond))
	fmt.Fprintf(w, "operand pods\t%d\n", 6**nodes)
	fmt.Fprintf(w, "\nmanager API requests\tapply -> Ready\tidle %s\n", *idle)
	for _, k := range framework.SortedRequests(after) {
		b, i := busy[k]-before[k], after[k]-busy[k]
		if b == 0 && i == 0 {
			continue
		}
		fmt.Fprintf(w, "%s %s\t%.0f\t%.0f\n", k.Verb, k.Resource, b, i)
	}
	return w.Flush()
}
