// Command bench-raycluster measures the RayCluster reconciler on the
// simulated cluster the way REFERENCE.md reports KubeRay v1.5.0: N
// RayClusters of 1 head + 3 workers on N nodes, time from creating them to
// all ready, the manager's peak and settled RSS (VmHWM/VmRSS of its
// process) and its API writes by verb and resource, then idle writes.
//
//	go run ./e2e/cmd/bench-raycluster --clusters 100 [-- extra manager flags]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/e2e/bench"
	"github.com/loom-dev/loom/e2e/framework"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench-raycluster: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("clusters", 100, "RayClusters of 1 head + 3 workers")
	idle := flag.Duration("idle", 30*time.Second, "idle window after all are ready")
	loomBin := flag.String("loom", "", "loom binary (default: build ./cmd/manager)")
	flag.Parse()
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
	if _, err := c.CreateNodes(ctx, framework.NodeSpec{Prefix: "node", Count: *n}); err != nil {
		return err
	}
	logf("%d nodes Ready", *n)
	rel, err := c.InstallChart(ctx, "loom", "loom-system", "nodeAgent.enabled=false")
	if err != nil {
		return err
	}
	m, err := c.RunManager(ctx, *loomBin, rel, append([]string{"--controllers=raycluster", "--gang-scheduler=none"}, flag.Args()...)...)
	if err != nil {
		return err
	}
	defer m.Stop(20 * time.Second)
	if err := c.WaitReady(ctx, m, "loom-system", "loom-manager", 2*time.Minute); err != nil {
		return err
	}
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}); err != nil {
		return err
	}
	token := c.Config.BearerToken
	before, err := m.APIRequests(token)
	if err != nil {
		return err
	}
	rssBefore, _ := framework.RSS(m.PID())
	start := time.Now()
	for i := range *n {
		if err := c.Client.Create(ctx, bench.RayCluster("bench", fmt.Sprintf("rc-%d", i))); err != nil {
			return err
		}
	}
	logf("%d RayClusters created (by this program) after %s", *n, time.Since(start).Round(10*time.Millisecond))
	var took, podsMade time.Duration
	for took == 0 {
		if podsMade == 0 {
			pods := &metav1.PartialObjectMetadataList{}
			pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
			if err := c.Client.List(ctx, pods, client.InNamespace("bench")); err != nil {
				return err
			}
			if len(pods.Items) >= 4**n {
				podsMade = time.Since(start)
				logf("all %d pods created after %s", 4**n, podsMade.Round(10*time.Millisecond))
			}
		}
		var list rayv1.RayClusterList
		if err := c.Client.List(ctx, &list, client.InNamespace("bench")); err != nil {
			return err
		}
		ready := 0
		for _, rc := range list.Items {
			if rc.Status.State == rayv1.Ready {
				ready++
			}
		}
		if ready == *n {
			took = time.Since(start)
			break
		}
		if err := c.Check(); err != nil {
			return err
		}
		if time.Since(start) > 15*time.Minute {
			return fmt.Errorf("%d of %d ready after 15m", ready, *n)
		}
		time.Sleep(250 * time.Millisecond)
	}
	logf("%d RayClusters ready after %s", *n, took.Round(10*time.Millisecond))
	time.Sleep(3 * time.Second) // let coalesced status writes land
	busy, err := m.APIRequests(token)
	if err != nil {
		return err
	}
	peak, _ := framework.PeakRSS(m.PID())
	time.Sleep(*idle)
	after, err := m.APIRequests(token)
	if err != nil {
		return err
	}
	settled, _ := framework.RSS(m.PID())

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "RayClusters (1 head + 3 workers)\t%d (%d pods) on %d nodes\n", *n, 4**n, *n)
	fmt.Fprintf(w, "create -> all pods created\t%s\n", podsMade.Round(10*time.Millisecond))
	fmt.Fprintf(w, "create -> all ready\t%s\n", took.Round(10*time.Millisecond))
	fmt.Fprintf(w, "manager RSS before / peak / settled\t%d / %d / %d MiB\n", rssBefore>>20, peak>>20, settled>>20)
	fmt.Fprintf(w, "KubeRay v1.5.0, same machine type (REFERENCE.md)\t100 clusters: 9 s, RSS 68 MiB, 1,232 writes\n")
	fmt.Fprintf(w, "\nmanager API requests\tbusy\tidle %s\n", *idle)
	writes := 0.0
	for _, k := range framework.SortedRequests(after) {
		b, i := busy[k]-before[k], after[k]-busy[k]
		if b == 0 && i == 0 {
			continue
		}
		if k.Verb != "get" && k.Verb != "list" && k.Verb != "watch" && !strings.Contains(k.Resource, "lease") {
			writes += b
		}
		fmt.Fprintf(w, "%s %s\t%.0f\t%.0f\n", k.Verb, k.Resource, b, i)
	}
	fmt.Fprintf(w, "writes (busy, without the lease)\t%.0f\t\n", writes)
	return w.Flush()
}
