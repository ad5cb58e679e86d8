// Command bench-training measures how fast the training reconciler creates a
// large gang on the simulated cluster: a TrainingJob of 1 master and N-1
// workers (1 GPU each) on 8-GPU nodes, once with the manager's default client
// rate limits and once with client-go's (QPS 20, burst 30) in the same run,
// from the job's creation to every pod created, to every pod running, and
// the manager's API requests for each.
//
//	go run ./e2e/cmd/bench-training --pods 512 --nodes 64
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

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench-training: %v\n", err)
		os.Exit(1)
	}
}

type result struct {
	name             string
	created, running time.Duration
	requests         map[framework.APIRequest]float64
}

func run() error {
	pods := flag.Int("pods", 512, "pods in the gang (1 master + pods-1 workers)")
	nodes := flag.Int("nodes", 64, "simulated 8-GPU nodes")
	loomBin := flag.String("loom", "", "loom binary (default: build ./cmd/manager)")
	flag.Parse()
	if *pods < 2 || *nodes*8 < *pods {
		return fmt.Errorf("need 2 <= pods <= 8 × nodes")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
	}
	cluster, err := framework.Start(ctx, framework.Options{Logf: logf, KeepDir: os.Getenv("LOOM_E2E_KEEP") != ""})
	if err != nil {
		return err
	}
	defer cluster.Stop()
	if *loomBin == "" {
		if *loomBin, err = framework.BuildLoom(cluster.Dir); err != nil {
			return err
		}
	}
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "gpu", Count: *nodes, GPUs: 8, Pods: "200"}); err != nil {
		return err
	}
	logf("%d nodes Ready", *nodes)
	rel, err := cluster.InstallChart(ctx, "loom", "loom-system", "nodeAgent.enabled=false")
	if err != nil {
		return err
	}
	if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}); err != nil {
		return err
	}

	var results []result
	for _, c := range []struct {
		name string
		args []string
	}{
		{"loom defaults (QPS 300, burst 600)", nil},
		{"client-go defaults (QPS 20, burst 30)", []string{"--kube-api-qps=20", "--kube-api-burst=30"}},
	} {
		r, err := measure(ctx, cluster, *loomBin, rel, c.name, fmt.Sprintf("gang-%d", len(results)), int32(*pods-1), c.args, logf)
		if err != nil {
			return err
		}
		results = append(results, r)
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "gang\t1 master + %d workers, 1 GPU each, %d nodes\n\n", *pods-1, *nodes)
	fmt.Fprintf(w, "client settings\tall pods created\tpods/s\tall pods running\tmanager writes\n")
	for _, r := range results {
		writes := 0.0
		for k, v := range r.requests {
			if k.Verb != "get" && k.Verb != "list" && k.Verb != "watch" {
				writes += v
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%.0f\t%s\t%.0f\n", r.name, r.created.Round(10*time.Millisecond),
			float64(*pods)/r.created.Seconds(), r.running.Round(10*time.Millisecond), writes)
	}
	for _, r := range results {
		fmt.Fprintf(w, "\nAPI requests: %s\t\n", r.name)
		for _, k := range framework.SortedRequests(r.requests) {
			fmt.Fprintf(w, "  %s %s\t%.0f\n", k.Verb, k.Resource, r.requests[k])
		}
	}
	return w.Flush()
}

// measure runs a fresh manager with extra args, submits the gang and times
// it; the manager is stopped afterwards.
func measure(ctx context.Context, c *framework.Cluster, loomBin string, rel *framework.Release, name, job string, workers int32, args []string, logf func(string, ...any)) (result, error) {
	r := result{name: name}
	m, err := c.RunManager(ctx, loomBin, rel, append([]string{"--controllers=trainingjob", "--gang-scheduler=none"}, args...)...)
	if err != nil {
		return r, err
	}
	defer m.Stop(20 * time.Second)
	if err := c.WaitReady(ctx, m, "loom-system", "loom-manager", 2*time.Minute); err != nil {
		return r, err
	}
	token := c.Config.BearerToken
	before, err := m.APIRequests(token)
	if err != nil {
		return r, err
	}
	tmpl := corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "pytorch", Image: "pytorch/pytorch:2.5.1",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{framework.GPUResource: resource.MustParse("1")}}}}}}
	tj := &trainingv1alpha1.TrainingJob{
		ObjectMeta: metav1.ObjectMeta{Name: job, Namespace: "bench"},
		Spec: trainingv1alpha1.TrainingJobSpec{ReplicaSpecs: trainingv1alpha1.ReplicaSpecs{
			Master: trainingv1alpha1.ReplicaSpec{Template: tmpl},
			Worker: &trainingv1alpha1.ReplicaSpec{Replicas: ptr.To(workers), Template: tmpl},
		}},
	}
	total := int(workers) + 1
	start := time.Now()
	if err := c.Client.Create(ctx, tj); err != nil {
		return r, err
	}
	sel := client.MatchingLabels{"training.loom.dev/job-name": job}
	// Metadata-only lists while counting creations: the benchmark must not
	// be what loads the API server.
	for r.created == 0 {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := c.Client.List(ctx, list, client.InNamespace("bench"), sel); err != nil {
			return r, err
		}
		if len(list.Items) >= total {
			r.created = time.Since(start)
			logf("%s: %d pods created after %s", name, total, r.created.Round(10*time.Millisecond))
		}
		if err := tick(c, start, 50*time.Millisecond, fmt.Sprintf("%s: %d of %d pods created", name, len(list.Items), total)); err != nil {
			return r, err
		}
	}
	for r.running == 0 {
		var list corev1.PodList
		if err := c.Client.List(ctx, &list, client.InNamespace("bench"), sel); err != nil {
			return r, err
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running == total {
			r.running = time.Since(start)
			logf("%s: %d pods running after %s", name, total, r.running.Round(10*time.Millisecond))
		}
		if err := tick(c, start, 250*time.Millisecond, fmt.Sprintf("%s: %d of %d pods running", name, running, total)); err != nil {
			return r, err
		}
	}
	// Let status writes settle, then count.
	time.Sleep(3 * time.Second)
	after, err := m.APIRequests(token)
	if err != nil {
		return r, err
	}
	r.requests = map[framework.APIRequest]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 && !strings.Contains(k.Resource, "leases") {
			r.requests[k] = d
		}
	}
	// Free the GPUs for the next run.
	if err := c.Client.Delete(ctx, tj, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		return r, err
	}
	gone := time.Now()
	for {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := c.Client.List(ctx, list, client.InNamespace("bench"), sel); err != nil {
			return r, err
		}
		if len(list.Items) == 0 {
			return r, nil
		}
		if err := tick(c, gone, 500*time.Millisecond, fmt.Sprintf("%d pods of %s still there", len(list.Items), job)); err != nil {
			return r, err
		}
	}
}

// tick sleeps d, failing when a cluster process died or 10 minutes passed.
func tick(c *framework.Cluster, since time.Time, d time.Duration, what string) error {
	if err := c.Check(); err != nil {
		return err
	}
	if time.Since(since) > 10*time.Minute {
		return fmt.Errorf("after 10m: %s", what)
	}
	time.Sleep(d)
	return nil
}
