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
	"strings"
	"syscall"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
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
	systems := flag.String("systems", "dgx-h100,dgx-a100:mig,dgx-b200", "simulated GPU nodes, one per entry: dgx-a100, dgx-h100, dgx-h200 or dgx-b200, \":mig\" for MIG mode (3g.20gb, 2g.10gb, 2 x 1g.5gb per GPU)")
	cpuNodes := flag.Int("cpu-nodes", 1, "simulated CPU-only nodes")
	sampleJob := flag.String("sample-job", "config/samples/trainingjob-pytorch.yaml", "TrainingJob to submit once the manager runs (empty: none)")
	sampleRay := flag.String("sample-raycluster", "config/samples/raycluster-gpu.yaml", "RayCluster to create once the manager runs (empty: none)")
	dir := flag.String("dir", "", "directory for the cluster's data and logs (default: a new temporary directory, removed on exit)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	logf := func(format string, args ...any) {
		fmt.Printf("[%5.1fs] %s\n", time.Since(started).Seconds(), fmt.Sprintf(format, args...))
	}

	logf("building tools if needed (the first run compiles Kubernetes from source: ~25 min on 2 cores)")
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
	var agents []framework.AgentSpec
	for i, entry := range strings.Split(*systems, ",") {
		system, mode, _ := strings.Cut(strings.TrimSpace(entry), ":")
		if system == "" {
			continue
		}
		name := fmt.Sprintf("gpu-node-%d", i)
		spec := framework.AgentSpec{Node: name, System: system}
		if mode == "mig" {
			spec.MIG = "3g.20gb:1,2g.10gb:1,1g.5gb:2"
		}
		if _, err := cluster.CreateNode(ctx, name, framework.NodeSpec{GPUs: 8, Product: system}); err != nil {
			return err
		}
		agents = append(agents, spec)
	}
	logf("%d simulated GPU nodes Ready", len(agents))
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
	// No Volcano scheduler runs on the simulated cluster: gangs go to the
	// kube-scheduler.
	m, err := cluster.RunManager(ctx, *loomBin, rel, "--log-format=text", "--gang-scheduler=none")
	if err != nil {
		return err
	}
	if err := cluster.WaitReady(ctx, m, ns, "loom-manager", 2*time.Minute); err != nil {
		return err
	}
	logf("manager ready and leading (PID %d, as service account %s/%s)", m.PID(), ns, rel.ServiceAccount)
	for _, spec := range agents {
		p, err := cluster.RunAgent(ctx, *loomBin, rel, spec)
		if err != nil {
			return err
		}
		logf("node agent for %s simulating %s%s (PID %d, token bound to its DaemonSet pod)", spec.Node, spec.System,
			map[bool]string{true: " with MIG", false: ""}[spec.MIG != ""], p.PID())
	}

	// The demo's fleet mixes MIG profiles on one node: the mixed strategy
	// advertises each profile (the API's default, single, would mark that
	// node MIG-INVALID, as GFD does).
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: gpuv1alpha1.ClusterPolicySpec{MIG: gpuv1alpha1.MIGSpec{Strategy: gpuv1alpha1.MIGStrategyMixed}}}
	if err := cluster.Client.Create(ctx, cp); err != nil {
		return fmt.Errorf("applying the default ClusterPolicy: %w", err)
	}
	logf("applied ClusterPolicy default (mig.strategy mixed, all else defaulted); the GPU stack rolls out on the GPU nodes")
	if *sampleJob != "" {
		job, err := submitJob(ctx, cluster, *sampleJob)
		if err != nil {
			return err
		}
		logf("submitted TrainingJob %s/%s from %s; kwok ends its pods with exit code 0 after the time its sim.loom.dev annotations say", job.Namespace, job.Name, *sampleJob)
	}
	if *sampleRay != "" {
		rc := &rayv1.RayCluster{}
		if err := create(ctx, cluster, *sampleRay, rc); err != nil {
			return err
		}
		logf("created RayCluster %s/%s from %s", rc.Namespace, rc.Name, *sampleRay)
	}

	fmt.Printf(`
Loom is running on a simulated cluster.

  export KUBECONFIG=%s
  %s get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/mig.strategy
  %s get gpunodes
  %s get clusterpolicy default -o yaml
  %s -n %s get lease loom-manager
  %s get trainingjobs,rayclusters -A

The chart's pods in %s are simulated by kwok; the real manager runs here as
PID %d under the chart's service account, and one simulated node agent per
GPU node under a token bound to that node's agent pod. Logs of every process:
  %s/*.log

Press Ctrl-C to stop everything.
`, cluster.Kubeconfig, cluster.Kubectl(), cluster.Kubectl(), cluster.Kubectl(), cluster.Kubectl(), ns, cluster.Kubectl(), ns, m.PID(), cluster.Dir)

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

// submitJob creates the TrainingJob of a YAML file, and its namespace.
func submitJob(ctx context.Context, cluster *framework.Cluster, path string) (*trainingv1alpha1.TrainingJob, error) {
	job := &trainingv1alpha1.TrainingJob{}
	return job, create(ctx, cluster, path, job)
}

// create creates the object of a YAML file, and its namespace.
func create(ctx context.Context, cluster *framework.Cluster, path string, obj client.Object) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(b, obj); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if obj.GetNamespace() == "" {
		obj.SetNamespace("default")
	}
	if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: obj.GetNamespace()}}); client.IgnoreAlreadyExists(err) != nil {
		return err
	}
	if err := cluster.Client.Create(ctx, obj); err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	return nil
}
