// Package bench is Loom's benchmark harness on the simulated cluster, and
// its scenarios (`go run ./e2e/cmd/bench <scenario>`). The harness brings
// the cluster and the loom binary up (Up, which the demo uses too), runs
// managers ready and leading (StartManager), takes snapshots of a manager's
// API requests and memory (Snapshot), polls, and prints one table (Table).
//
// The scenarios:
//   - fleet (this file): GPU nodes with their inventory, a ClusterPolicy
//     rolled out to Ready, a large training gang, smaller jobs and
//     RayClusters among the cluster's other pods, then an idle window; the
//     e2e suite runs a small version whose structural checks (no idle
//     writes, no idle reads around the cache) fail the build;
//   - gpu-stack: a ClusterPolicy rolled out on GPU nodes, then idle;
//   - gang: one large TrainingJob gang at Loom's and client-go's client
//     limits;
//   - raycluster: many RayClusters to ready, the manager's RSS and writes;
//   - pending (pending.go): TrainingJobs waiting for GPUs while others
//     finish and start, the manager's writes per minute;
//   - compare (compare.go, `make bench`): Loom side by side with KubeRay and
//     Kubeflow's Training Operator, each contender on a fresh cluster, one
//     table of ratios against the product's goals.
package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// Config sizes a fleet run.
type Config struct {
	// Nodes are simulated 8-GPU nodes.
	Nodes int
	// Agents of them run a real `loom-node-agent --simulate` process, whose
	// RSS and CPU per collection are measured; the benchmark publishes the
	// other nodes' inventory itself, from the same simulator (a thousand
	// agent processes do not fit on the benchmark machine).
	Agents int
	// AgentInterval is the measured agents' collection interval.
	AgentInterval time.Duration
	// GangPods is the large TrainingJob (1 master + GangPods-1 workers, 1
	// GPU each).
	GangPods int
	// SmallJobs are jobs of 1 master + 1 worker with 8 GPUs each.
	SmallJobs int
	// RayClusters of 1 head + 3 workers.
	RayClusters int
	// BackgroundPods are the cluster's other pods (not Loom's), which
	// Loom's pod informer sees too.
	BackgroundPods int
	Idle           time.Duration
	// ManagerArgs are extra manager flags, ManagerEnv extra environment
	// variables (GOGC=…).
	ManagerArgs []string
	ManagerEnv  []string
	// Prefix keeps the run's nodes and namespaces apart from others'.
	Prefix string
}

// Report is what a fleet run measured.
type Report struct {
	Config Config
	Pods   int // in the cluster at the end

	PolicyReady    time.Duration
	GangCreated    time.Duration
	GangPodsPerSec float64
	// GangThrottled is how long the manager's requests waited for its own
	// client rate limit while the gang's pods were created, over
	// GangRequests requests.
	GangThrottled   time.Duration
	GangRequests    float64
	RayReady        time.Duration
	ClientQPS       string
	ManagerRSSStart int64
	ManagerRSSPeak  int64
	ManagerRSS      int64
	ManagerFileRSS  int64 // of ManagerRSS, the binary's pages
	ManagerHeap     float64
	// ManagerCPU is the manager's CPU time from its start to the end of the
	// idle window; ManagerIdleCPU is what the idle window took of it.
	ManagerCPU, ManagerIdleCPU time.Duration
	AgentRSS                   int64
	AgentFileRSS               int64
	// AgentCPUPerRun is an agent's CPU per collection once its GPUNode was
	// published; AgentStartCPU its CPU up to then (start-up and its first
	// AgentStartRuns collections); AgentRuns its collections in all.
	AgentCPUPerRun, AgentStartCPU time.Duration
	AgentRuns, AgentStartRuns     float64

	// Requests by phase: the rollout (apply → Ready), the workloads
	// (submitted → all running/ready), and the idle window.
	Rollout, Workloads, Idle map[framework.APIRequest]float64
}

// IdleWrites are the idle window's writes apart from the leader-election
// lease, and IdleReads its gets and lists (a no-op reconcile reads only
// from the cache), apart from the metrics endpoint's own authentication
// of the benchmark's scrapes.
func (r *Report) IdleWrites() map[framework.APIRequest]float64 {
	return pick(r.Idle, func(k framework.APIRequest) bool { return isWrite(k) && !isLease(k) })
}

func (r *Report) IdleReads() map[framework.APIRequest]float64 {
	return pick(r.Idle, func(k framework.APIRequest) bool {
		return (k.Verb == "get" || k.Verb == "list") && !isLease(k)
	})
}

// RunFleet is the fleet scenario on env: Prepare, the chart (with its node
// agent DaemonSet), then Run with env's manager flags and environment.
func RunFleet(ctx context.Context, env *Env, cfg Config) (*Report, error) {
	cfg.ManagerArgs = append(cfg.ManagerArgs, env.ManagerArgs...)
	cfg.ManagerEnv = append(cfg.ManagerEnv, env.ManagerEnv...)
	if err := Prepare(ctx, env.Cluster, &cfg, env.Logf); err != nil {
		return nil, err
	}
	rel, err := env.Install(ctx)
	if err != nil {
		return nil, err
	}
	return Run(ctx, env.Cluster, env.Loom, rel, cfg, env.Logf)
}

// Prepare creates the fleet's nodes (Ready, before the chart is installed:
// its manager Deployment needs a node) and the cluster's other pods.
func Prepare(ctx context.Context, c *framework.Cluster, cfg *Config, logf func(string, ...any)) error {
	if cfg.Prefix == "" {
		cfg.Prefix = "bench"
	}
	ns := cfg.Prefix
	for _, n := range []string{ns, ns + "-background"} {
		if err := createNamespace(ctx, c, n); err != nil {
			return err
		}
	}
	if _, err := c.CreateNodes(ctx, framework.NodeSpec{Prefix: cfg.Prefix + "-gpu", Count: cfg.Nodes, GPUs: 8, Pods: "250",
		Labels: map[string]string{"nvidia.com/gpu.present": "true"}}); err != nil {
		return err
	}
	logf("%d GPU nodes Ready", cfg.Nodes)
	if err := createBackgroundPods(ctx, c, ns+"-background", cfg.BackgroundPods); err != nil {
		return err
	}
	logf("%d background pods created", cfg.BackgroundPods)
	return nil
}

// Run measures on cluster c, prepared by Prepare, with the chart release
// rel (its node agent DaemonSet enabled) and the loom binary. It removes its
// policy and workloads at the end; the nodes stay.
func Run(ctx context.Context, c *framework.Cluster, loomBin string, rel *framework.Release, cfg Config, logf func(string, ...any)) (*Report, error) {
	env := &Env{Cluster: c, Loom: loomBin, Logf: logf, ManagerArgs: cfg.ManagerArgs, ManagerEnv: cfg.ManagerEnv}
	r := &Report{Config: cfg, ClientQPS: clientQPS(cfg.ManagerArgs)}
	m, err := env.StartManager(ctx, rel, "--gang-scheduler=none")
	if err != nil {
		return nil, err
	}
	defer m.Stop(20 * time.Second)
	r.ManagerRSSStart = m.Ready.RSS

	// Inventory: real agents on the first nodes, the rest published here.
	nodes := make([]string, cfg.Nodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("%s-gpu-%d", cfg.Prefix, i)
	}
	agents, err := startAgents(ctx, c, loomBin, rel, nodes[:min(cfg.Agents, len(nodes))], cfg.AgentInterval)
	defer stopAgents(agents)
	if err != nil {
		return nil, err
	}
	if err := publishInventory(ctx, c, nodes[len(agents):]); err != nil {
		return nil, err
	}
	logf("inventory of %d nodes published (%d by agent processes)", len(nodes), len(agents))
	started := sampleAgents(agents)
	if err := r.measure(ctx, env, m, rel.Namespace); err != nil {
		return nil, err
	}
	r.measureAgents(agents, started)
	if n, err := countPods(ctx, c); err == nil {
		r.Pods = n
	}
	return r, nil
}

func clientQPS(managerArgs []string) string {
	for _, a := range managerArgs {
		if strings.HasPrefix(a, "--kube-api-") {
			return strings.Join(managerArgs, " ")
		}
	}
	return "QPS 300, burst 600 (Loom's defaults)"
}

// measure rolls a ClusterPolicy out, runs the workloads, then idles, with a
// snapshot of the manager between phases.
func (r *Report) measure(ctx context.Context, env *Env, m *Manager, loomNS string) error {
	cfg, c := r.Config, env.Cluster
	s0, err := m.Snapshot()
	if err != nil {
		return err
	}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: cfg.Prefix}}
	defer removePolicy(c, cp, loomNS, env.Logf)
	// The rollout's time grows with the fleet: a generous bound.
	if r.PolicyReady, err = applyPolicy(ctx, c, cp, cfg.Nodes, 10*time.Minute+time.Duration(cfg.Nodes)*600*time.Millisecond); err != nil {
		return err
	}
	env.Logf("ClusterPolicy Ready on %d nodes after %s", cp.Status.GPUNodes, round(r.PolicyReady))
	settle()
	s1, err := m.Snapshot()
	if err != nil {
		return err
	}

	defer removeWorkloads(c, cfg.Prefix)
	if err := r.runWorkloads(ctx, env, m); err != nil {
		return err
	}
	settle()
	env.Logf("idle for %s", cfg.Idle)
	s2, s3, err := m.busyThenIdle(cfg.Idle)
	if err != nil {
		return err
	}
	r.ManagerRSSPeak = s2.PeakRSS
	r.ManagerCPU, r.ManagerIdleCPU = s3.CPU, s3.CPU-s2.CPU
	r.ManagerRSS, r.ManagerFileRSS = s3.RSS, s3.FileRSS
	r.ManagerHeap, _ = framework.MetricSum(m.Scrape(), "go_memstats_heap_inuse_bytes")
	r.Rollout, r.Workloads, r.Idle = s1.Since(s0), s2.Since(s1), s3.Since(s2)
	return nil
}

// Print writes the report as one table.
func (r *Report) Print(w io.Writer) error {
	t := NewTable(w)
	cfg := r.Config
	t.Row("fleet", "%d simulated 8-GPU nodes, %d pods in the cluster (%d background)", cfg.Nodes, r.Pods, cfg.BackgroundPods)
	if len(cfg.ManagerEnv) > 0 || len(cfg.ManagerArgs) > 0 {
		t.Row("manager run with", "%s", strings.Join(append(append([]string{}, cfg.ManagerEnv...), cfg.ManagerArgs...), " "))
	}
	agents := min(cfg.Agents, cfg.Nodes)
	t.Row("inventory", "%d GPUNodes from node-agent processes (measured below), %d published by the benchmark (scaled down: %d agent processes do not fit)",
		agents, cfg.Nodes-agents, cfg.Nodes)
	t.Row("workloads", "1 gang of %d pods, %d jobs of 2 × 8 GPUs, %d RayClusters of 4 pods", cfg.GangPods, cfg.SmallJobs, cfg.RayClusters)
	t.Row("ClusterPolicy apply -> Ready", "%s", round(r.PolicyReady))
	t.Row("gang: all pods created", "%s (%.0f pods/s; client limit %s)", round(r.GangCreated), r.GangPodsPerSec, r.ClientQPS)
	t.Row("gang: waits for the client limit", "%s over %.0f requests", r.GangThrottled.Round(time.Millisecond), r.GangRequests)
	t.Row("RayClusters: all ready", "%s", round(r.RayReady))
	t.Row("manager RSS start / peak / settled", "%s / %s / %s (settled: %s of it the binary's file pages)",
		mib(r.ManagerRSSStart), mib(r.ManagerRSSPeak), mib(r.ManagerRSS), mib(r.ManagerFileRSS))
	t.Row("manager heap in use (settled)", "%s", mib(int64(r.ManagerHeap)))
	t.Row("manager CPU: whole run / per idle minute", "%s / %s", r.ManagerCPU.Round(100*time.Millisecond),
		time.Duration(float64(r.ManagerIdleCPU)/cfg.Idle.Minutes()).Round(10*time.Millisecond))
	if r.AgentRuns > 0 {
		t.Row("node agent RSS / CPU per collection", "%s (%s file pages) / %s (%d agents, %.0f collections each; start-up and first %.0f: %s)",
			mib(r.AgentRSS), mib(r.AgentFileRSS), r.AgentCPUPerRun.Round(100*time.Microsecond), cfg.Agents, r.AgentRuns,
			r.AgentStartRuns, r.AgentStartCPU.Round(time.Millisecond))
	}
	t.Row("KubeRay (published)", "%s", `"500 MB for 500 Ray pods"`)
	t.Requests(Column{Name: "rollout", Counts: r.Rollout}, Column{Name: "workloads", Counts: r.Workloads},
		Column{Name: "idle per minute", Counts: r.Idle, PerMinuteOf: cfg.Idle})
	return t.Flush()
}
