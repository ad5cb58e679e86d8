// Command demo runs Loom on a local simulated GPU cluster: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kwok built from
// source, a few simulated GPU nodes, the chart installed with helm, and the
// manager running locally under the chart's service account. It prints a
// kubeconfig for kubectl and runs until Ctrl-C, then stops every process it
// started. Its bring-up (cluster, loom binary, chart, manager) is the
// benchmark harness's (e2e/bench).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/bench"
	"github.com/loom-dev/loom/e2e/framework"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	// The demo's own clients log nothing; without a logger controller-runtime
	// prints a stack trace the first time one of them would.
	ctrllog.SetLogger(logr.Discard())
	loomBin := flag.String("loom", "", "loom binary, with loom-node-agent beside it (default: build both)")
	systems := flag.String("systems", "dgx-h100,dgx-a100:mig,dgx-b200,dgx-h100:bare", "simulated GPU nodes, one per entry: dgx-a100, dgx-h100, dgx-h200 or dgx-b200, \":mig\" for MIG mode (3g.20gb, 2g.10gb, 2 x 1g.5gb per GPU), \":bare\" for a node with no driver yet (the GPU stack brings it up: kubectl get gpunodes -w)")
	cpuNodes := flag.Int("cpu-nodes", 1, "simulated CPU-only nodes")
	sampleJob := flag.String("sample-job", "config/samples/trainingjob-pytorch.yaml", "TrainingJob to submit once the manager runs (empty: none)")
	sampleRay := flag.String("sample-raycluster", "config/samples/raycluster-gpu.yaml", "RayCluster to create once the manager runs (empty: none)")
	dir := flag.String("dir", "", "directory for the cluster's data and logs (default: a new temporary directory, removed on exit)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := bench.Logger(os.Stdout)
	logf("building tools if needed (the first run compiles Kubernetes from source: ~25 min on 2 cores)")
	env, err := bench.Up(ctx, bench.UpOptions{Loom: *loomBin, Dir: *dir, Logf: logf})
	if err != nil {
		return err
	}
	defer func() {
		logf("stopping %d processes", len(env.Cluster.Processes()))
		env.Down()
		logf("stopped; nothing left running")
	}()
	agents, err := createNodes(ctx, env, *systems, *cpuNodes)
	if err != nil {
		return err
	}
	m, rel, err := startLoom(ctx, env, agents)
	if err != nil {
		return err
	}
	if err := applySamples(ctx, env, *sampleJob, *sampleRay); err != nil {
		return err
	}
	printBanner(env.Cluster, rel, m)
	if err := env.Watch(ctx); err != nil {
		return err
	}
	fmt.Println()
	return nil
}

// createNodes creates a GPU node per entry of systems and cpuNodes CPU
// nodes, and returns the GPU nodes' agents.
func createNodes(ctx context.Context, env *bench.Env, systems string, cpuNodes int) ([]framework.AgentSpec, error) {
	var agents []framework.AgentSpec
	for i, entry := range strings.Split(systems, ",") {
		system, mode, _ := strings.Cut(strings.TrimSpace(entry), ":")
		if system == "" {
			continue
		}
		name := fmt.Sprintf("gpu-node-%d", i)
		spec := framework.AgentSpec{Node: name, System: system}
		if mode == "mig" {
			spec.MIG = "3g.20gb:1,2g.10gb:1,1g.5gb:2"
		}
		if mode == "bare" {
			name = fmt.Sprintf("bare-node-%d", i)
			spec.Node, spec.Bare = name, true
		}
		if _, err := env.Cluster.CreateNode(ctx, name, framework.NodeSpec{GPUs: 8, Product: system, Bare: spec.Bare}); err != nil {
			return nil, err
		}
		agents = append(agents, spec)
	}
	env.Logf("%d simulated GPU nodes Ready", len(agents))
	if cpuNodes > 0 {
		names, err := env.Cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "cpu-node", Count: cpuNodes})
		if err != nil {
			return nil, err
		}
		env.Logf("%d CPU nodes Ready: %v", len(names), names)
	}
	return agents, nil
}

// startLoom installs the chart, runs the manager until ready and leading,
// and the node agents.
func startLoom(ctx context.Context, env *bench.Env, agents []framework.AgentSpec) (*bench.Manager, *framework.Release, error) {
	rel, err := env.Install(ctx)
	if err != nil {
		return nil, nil, err
	}
	env.Logf("chart installed: release %s in %s", rel.Name, rel.Namespace)
	// No Volcano scheduler runs on the simulated cluster: gangs go to the
	// kube-scheduler.
	m, err := env.StartManager(ctx, rel, "--log-format=text", "--gang-scheduler=none")
	if err != nil {
		return nil, nil, err
	}
	env.Logf("manager ready and leading (PID %d, as service account %s/%s)", m.PID(), rel.Namespace, rel.ServiceAccount)
	// Bare nodes' operand containers are played by the node simulator:
	// the driver loads once its pod runs, the device plugin advertises
	// GPUs once the toolkit is validated, the MIG manager applies layouts.
	sim := env.Cluster.StartNodeSim(ctx, rel.Namespace)
	for _, spec := range agents {
		if spec.Bare {
			var err error
			if spec, err = sim.Add(spec); err != nil {
				return nil, nil, err
			}
		}
		p, err := env.Cluster.RunAgent(ctx, env.Loom, rel, spec)
		if err != nil {
			return nil, nil, err
		}
		how := map[bool]string{true: " with MIG", false: ""}[spec.MIG != ""]
		if spec.Bare {
			how = ", bare: no driver until the ClusterPolicy's driver pod runs there"
		}
		env.Logf("node agent for %s simulating %s%s (PID %d, token bound to its DaemonSet pod)", spec.Node, spec.System, how, p.PID())
	}
	return m, rel, nil
}

// applySamples applies the default ClusterPolicy and the sample TrainingJob
// and RayCluster (an empty path: none).
func applySamples(ctx context.Context, env *bench.Env, sampleJob, sampleRay string) error {
	// The demo's fleet mixes MIG profiles on one node: the mixed strategy
	// advertises each profile (the API's default, single, would mark that
	// node MIG-INVALID, as GFD does).
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: gpuv1alpha1.ClusterPolicySpec{MIG: gpuv1alpha1.MIGSpec{Strategy: gpuv1alpha1.MIGStrategyMixed}}}
	if err := env.Cluster.Client.Create(ctx, cp); err != nil {
		return fmt.Errorf("applying the default ClusterPolicy: %w", err)
	}
	env.Logf("applied ClusterPolicy default (mig.strategy mixed, all else defaulted); the GPU stack rolls out on the GPU nodes")
	if sampleJob != "" {
		job := &trainingv1alpha1.TrainingJob{}
		if err := create(ctx, env.Cluster, sampleJob, job); err != nil {
			return err
		}
		env.Logf("submitted TrainingJob %s/%s from %s; kwok ends its pods with exit code 0 after the time its sim.loom.dev annotations say", job.Namespace, job.Name, sampleJob)
	}
	if sampleRay != "" {
		rc := &rayv1.RayCluster{}
		if err := create(ctx, env.Cluster, sampleRay, rc); err != nil {
			return err
		}
		env.Logf("created RayCluster %s/%s from %s", rc.Namespace, rc.Name, sampleRay)
	}
	return nil
}

func printBanner(cluster *framework.Cluster, rel *framework.Release, m *bench.Manager) {
	kubectl, ns := cluster.Kubectl(), rel.Namespace
	fmt.Printf(`
Loom is running on a simulated cluster.

  export KUBECONFIG=%s
  %s get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/mig.strategy
  %s get gpunodes -w        (the bare node: PCI GPUs first, NVML once its driver runs)
  %s get clusterpolicy default -o yaml
  %s -n %s get lease loom-manager
  %s get trainingjobs,rayclusters -A

The chart's pods in %s are simulated by kwok; the real manager runs here as
PID %d under the chart's service account, and one simulated node agent per
GPU node under a token bound to that node's agent pod. Logs of every process:
  %s/*.log

Press Ctrl-C to stop everything.
`, cluster.Kubeconfig, kubectl, kubectl, kubectl, kubectl, ns, kubectl, ns, m.PID(), cluster.Dir)
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
