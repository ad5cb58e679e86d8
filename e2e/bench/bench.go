// Package bench measures Loom at fleet size on the simulated cluster: GPU
// nodes with their inventory, a ClusterPolicy rolled out to Ready, a large
// training gang, smaller jobs and RayClusters among the cluster's other
// pods, then an idle window. It reports times, the manager's API requests by
// phase, its memory, and the node agent's cost. `make bench` runs it at 1,000
// nodes (e2e/cmd/bench); the e2e suite runs a small version whose figures
// CI prints and whose structural checks (no idle writes, no idle reads
// around the cache) fail the build.
package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
)

// Config sizes a run.
type Config struct {
	// Nodes are simulated 8-GPU nodes.
	Nodes int
	// Agents of them run a real `loom node-agent --simulate` process, whose
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

// Report is what a run measured.
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
	AgentCPUPerRun             time.Duration
	AgentRuns                  float64

	// Requests by phase: the rollout (apply → Ready), the workloads
	// (submitted → all running/ready), and the idle window.
	Rollout, Workloads, Idle map[framework.APIRequest]float64
}

// IdleWrites are the idle window's writes apart from the leader-election
// lease, and IdleReads its gets and lists (a no-op reconcile reads only
// from the cache), apart from the metrics endpoint's own authentication
// of the benchmark's scrapes.
func (r *Report) IdleWrites() map[framework.APIRequest]float64 {
	return pick(r.Idle, func(k framework.APIRequest) bool { return isWrite(k) && !strings.HasPrefix(k.Resource, "leases") })
}

func (r *Report) IdleReads() map[framework.APIRequest]float64 {
	return pick(r.Idle, func(k framework.APIRequest) bool {
		return (k.Verb == "get" || k.Verb == "list") && !strings.HasPrefix(k.Resource, "leases")
	})
}

func isWrite(k framework.APIRequest) bool {
	switch k.Verb {
	case "get", "list", "watch":
		return false
	}
	// The metrics endpoint authenticates each scrape (TokenReview,
	// SubjectAccessReview): the benchmark's own reads, not reconciliation.
	return k.Resource != "tokenreviews" && k.Resource != "subjectaccessreviews"
}

func pick(m map[framework.APIRequest]float64, keep func(framework.APIRequest) bool) map[framework.APIRequest]float64 {
	out := map[framework.APIRequest]float64{}
	for k, v := range m {
		if v != 0 && keep(k) {
			out[k] = v
		}
	}
	return out
}

// Prepare creates the fleet's nodes (Ready, before the chart is installed:
// its manager Deployment needs a node) and the cluster's other pods.
func Prepare(ctx context.Context, c *framework.Cluster, cfg *Config, logf func(string, ...any)) error {
	if cfg.Prefix == "" {
		cfg.Prefix = "bench"
	}
	ns := cfg.Prefix
	for _, n := range []string{ns, ns + "-background"} {
		if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); client.IgnoreAlreadyExists(err) != nil {
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
	r := &Report{Config: cfg}
	ns := cfg.Prefix
	nodes := make([]string, cfg.Nodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("%s-gpu-%d", cfg.Prefix, i)
	}
	m, err := c.RunManagerEnv(ctx, loomBin, rel, cfg.ManagerEnv, append([]string{"--gang-scheduler=none"}, cfg.ManagerArgs...)...)
	if err != nil {
		return nil, err
	}
	defer m.Stop(20 * time.Second)
	if err := c.WaitReady(ctx, m, rel.Namespace, "loom-manager", 3*time.Minute); err != nil {
		return nil, err
	}
	r.ClientQPS = "QPS 300, burst 600 (Loom's defaults)"
	for _, a := range cfg.ManagerArgs {
		if strings.HasPrefix(a, "--kube-api-") {
			r.ClientQPS = strings.Join(cfg.ManagerArgs, " ")
		}
	}
	r.ManagerRSSStart, _ = framework.RSS(m.PID())
	token := c.Config.BearerToken
	reqs := func() (map[framework.APIRequest]float64, error) { return m.APIRequests(token) }

	// Inventory: real agents on the first nodes, the rest published here.
	agents, err := startAgents(ctx, c, loomBin, rel, nodes[:min(cfg.Agents, len(nodes))], cfg.AgentInterval)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, a := range agents {
			a.proc.Stop(5 * time.Second)
		}
	}()
	if err := publishInventory(ctx, c, nodes[len(agents):]); err != nil {
		return nil, err
	}
	logf("inventory of %d nodes published (%d by agent processes)", len(nodes), len(agents))

	r0, err := reqs()
	if err != nil {
		return nil, err
	}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: cfg.Prefix}}
	applied := time.Now()
	if err := c.Client.Create(ctx, cp); err != nil {
		return nil, err
	}
	defer removePolicy(c, cp, rel.Namespace, logf)
	// About 3 minutes per 1,000 nodes on two cores; much more to spare.
	if err := poll(ctx, c, 10*time.Minute+time.Duration(cfg.Nodes)*600*time.Millisecond, func() (bool, string, error) {
		if err := c.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			return false, "", err
		}
		return cp.Status.State == gpuv1alpha1.PolicyReady && int(cp.Status.GPUNodes) >= cfg.Nodes,
			fmt.Sprintf("policy %s on %d GPU nodes", cp.Status.State, cp.Status.GPUNodes), nil
	}); err != nil {
		return nil, err
	}
	r.PolicyReady = time.Since(applied)
	logf("ClusterPolicy Ready on %d nodes after %s", cp.Status.GPUNodes, r.PolicyReady.Round(10*time.Millisecond))
	time.Sleep(3 * time.Second) // the rollout's last coalesced status write
	r1, err := reqs()
	if err != nil {
		return nil, err
	}

	defer removeWorkloads(c, ns)
	scrape := func() string { text, _ := m.Metrics(token); return text }
	if err := runWorkloads(ctx, c, ns, cfg, r, scrape, logf); err != nil {
		return nil, err
	}
	time.Sleep(3 * time.Second)
	r2, err := reqs()
	if err != nil {
		return nil, err
	}
	r.ManagerRSSPeak, _ = framework.PeakRSS(m.PID())

	logf("idle for %s", cfg.Idle)
	cpu0, _ := framework.CPUSeconds(m.PID())
	time.Sleep(cfg.Idle)
	r3, err := reqs()
	if err != nil {
		return nil, err
	}
	cpu1, _ := framework.CPUSeconds(m.PID())
	r.ManagerCPU, r.ManagerIdleCPU = seconds(cpu1), seconds(cpu1-cpu0)
	r.ManagerRSS, _ = framework.RSS(m.PID())
	r.ManagerFileRSS, _ = framework.FileRSS(m.PID())
	if text, err := m.Metrics(token); err == nil {
		r.ManagerHeap, _ = framework.MetricSum(text, "go_memstats_heap_inuse_bytes")
	}
	r.Rollout, r.Workloads, r.Idle = diff(r1, r0), diff(r2, r1), diff(r3, r2)
	r.measureAgents(agents)
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := c.Client.List(ctx, pods); err == nil {
		r.Pods = len(pods.Items)
	}
	return r, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func diff(after, before map[framework.APIRequest]float64) map[framework.APIRequest]float64 {
	out := map[framework.APIRequest]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// poll checks cond every 250 ms until it holds, failing when a cluster
// process died or timeout passed.
func poll(ctx context.Context, c *framework.Cluster, timeout time.Duration, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, what, err := cond()
		if err != nil || ok {
			return err
		}
		if err := c.Check(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// parallel runs f(i) for i in [0, n) with 32 in flight.
func parallel(n int, f func(i int) error) error {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return apply.Each(idx, 32, f)
}

func createBackgroundPods(ctx context.Context, c *framework.Cluster, ns string, n int) error {
	return parallel(n, func(i int) error {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%d", i), Namespace: ns, Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.29",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}}}}},
		}
		return client.IgnoreAlreadyExists(c.Client.Create(ctx, p))
	})
}

// publishInventory writes each node's GPUNode as its agent would: the
// simulated DGX H100's NVML inventory, Ready.
func publishInventory(ctx context.Context, c *framework.Cluster, nodes []string) error {
	return parallel(len(nodes), func(i int) error {
		name := nodes[i]
		sim, err := inventory.Simulate(inventory.SimOptions{System: "dgx-h100", Seed: name})
		if err != nil {
			return err
		}
		if ret := sim.Init(); ret != nvml.SUCCESS {
			return fmt.Errorf("simulated NVML: %v", ret)
		}
		st, err := inventory.Collect(sim, nil)
		if err != nil {
			return err
		}
		st.Simulated = "dgx-h100"
		st.Conditions = []metav1.Condition{{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionTrue,
			Reason: gpuv1alpha1.ReasonCollected, Message: fmt.Sprintf("%d GPUs read through NVML", st.GPUCount),
			LastTransitionTime: metav1.Now()}}
		gpuNode := func() *unstructured.Unstructured {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gpuv1alpha1.GroupVersion.WithKind("GPUNode"))
			u.SetName(name)
			return u
		}
		if err := c.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(gpuNode()), client.FieldOwner("loom-bench")); err != nil {
			return err
		}
		status, err := runtimeToMap(&st)
		if err != nil {
			return err
		}
		gn := gpuNode() // no resourceVersion: the manager adds the Node owner reference meanwhile
		gn.Object["status"] = status
		return c.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(gn), client.FieldOwner("loom-bench"), client.ForceOwnership)
	})
}

type agentProc struct {
	proc       *framework.Process
	metricsURL string
}

func startAgents(ctx context.Context, c *framework.Cluster, loomBin string, rel *framework.Release, nodes []string, interval time.Duration) ([]agentProc, error) {
	var out []agentProc
	for _, n := range nodes {
		port, err := framework.FreePort()
		if err != nil {
			return out, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p, err := c.RunAgent(ctx, loomBin, rel, framework.AgentSpec{Node: n, System: "dgx-h100",
			Args: []string{"--metrics-bind-address=" + addr, "--interval=" + interval.String()}})
		if err != nil {
			return out, err
		}
		out = append(out, agentProc{proc: p, metricsURL: "http://" + addr + "/metrics"})
	}
	return out, nil
}

// measureAgents averages the agents' RSS and their CPU time per
// collection (all CPU the process used, over the collections it made).
func (r *Report) measureAgents(agents []agentProc) {
	var rss, file int64
	var cpu, runs float64
	for _, a := range agents {
		text, err := framework.HTTPMetrics(a.metricsURL)
		if err != nil {
			continue
		}
		n, _ := framework.MetricSum(text, "loom_node_agent_collection_duration_seconds_count")
		s, _ := framework.CPUSeconds(a.proc.PID())
		m, _ := framework.RSS(a.proc.PID())
		f, _ := framework.FileRSS(a.proc.PID())
		rss, file, cpu, runs = rss+m, file+f, cpu+s, runs+n
	}
	if len(agents) == 0 || runs == 0 {
		return
	}
	r.AgentRSS, r.AgentFileRSS = rss/int64(len(agents)), file/int64(len(agents))
	r.AgentRuns = runs / float64(len(agents))
	r.AgentCPUPerRun = time.Duration(cpu / runs * float64(time.Second))
}

func gpuTemplate(gpus string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "pytorch", Image: "pytorch/pytorch:2.5.1",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{framework.GPUResource: resource.MustParse(gpus)}}}}}}
}

func trainingJob(ns, name string, workers int32, gpus string) *trainingv1alpha1.TrainingJob {
	return &trainingv1alpha1.TrainingJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: trainingv1alpha1.TrainingJobSpec{ReplicaSpecs: trainingv1alpha1.ReplicaSpecs{
			Master: trainingv1alpha1.ReplicaSpec{Template: gpuTemplate(gpus)},
			Worker: &trainingv1alpha1.ReplicaSpec{Replicas: ptr.To(workers), Template: gpuTemplate(gpus)},
		}},
	}
}

// RayCluster is the benchmark's cluster: a head and 3 CPU workers.
func RayCluster(ns, name string) *rayv1.RayCluster {
	res := func(cpu, mem string) corev1.ResourceRequirements {
		l := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
		return corev1.ResourceRequirements{Requests: l, Limits: l}
	}
	return &rayv1.RayCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: rayv1.RayClusterSpec{
			RayVersion: "2.46.0",
			HeadGroupSpec: rayv1.HeadGroupSpec{RayStartParams: map[string]string{}, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "ray-head", Image: "rayproject/ray:2.46.0", Resources: res("1", "2Gi")}}}}},
			WorkerGroupSpecs: []rayv1.WorkerGroupSpec{{
				GroupName: "workers", Replicas: ptr.To[int32](3), MinReplicas: ptr.To[int32](0), MaxReplicas: ptr.To[int32](10),
				RayStartParams: map[string]string{},
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "ray-worker", Image: "rayproject/ray:2.46.0", Resources: res("1", "1Gi")}}}},
			}},
		},
	}
}

// runWorkloads submits the small jobs, then the gang, timing its pod
// creation, then the RayClusters, and waits until every job's pods run and every
// RayCluster is ready.
func runWorkloads(ctx context.Context, c *framework.Cluster, ns string, cfg Config, r *Report, scrape func() string, logf func(string, ...any)) error {
	// The client's rate limiter records every request's wait.
	limiter := func() (wait, n float64) {
		text := scrape()
		wait, _ = framework.MetricSum(text, "rest_client_rate_limiter_duration_seconds_sum")
		n, _ = framework.MetricSum(text, "rest_client_rate_limiter_duration_seconds_count")
		return wait, n
	}
	countPods := func(sel client.MatchingLabels) (int, error) {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		err := c.Client.List(ctx, list, client.InNamespace(ns), sel)
		return len(list.Items), err
	}
	// Whole-node jobs first: 1-GPU gang pods spread over every node would
	// leave no node with 8 GPUs free (Loom says so on the job).
	for i := range cfg.SmallJobs {
		if err := c.Client.Create(ctx, trainingJob(ns, fmt.Sprintf("job-%d", i), 1, "8")); err != nil {
			return err
		}
	}
	if err := poll(ctx, c, 10*time.Minute, func() (bool, string, error) {
		n, err := countPods(client.MatchingLabels{})
		return n >= 2*cfg.SmallJobs, fmt.Sprintf("%d of %d small-job pods created", n, 2*cfg.SmallJobs), err
	}); err != nil {
		return err
	}
	gang := trainingJob(ns, "gang", int32(cfg.GangPods-1), "1")
	wait0, n0 := limiter()
	start := time.Now()
	if err := c.Client.Create(ctx, gang); err != nil {
		return err
	}
	if err := poll(ctx, c, 10*time.Minute, func() (bool, string, error) {
		n, err := countPods(client.MatchingLabels{trainingv1alpha1.LabelJobName: "gang"})
		return n >= cfg.GangPods, fmt.Sprintf("%d of %d gang pods created", n, cfg.GangPods), err
	}); err != nil {
		return err
	}
	r.GangCreated = time.Since(start)
	r.GangPodsPerSec = float64(cfg.GangPods) / r.GangCreated.Seconds()
	wait1, n1 := limiter()
	r.GangThrottled, r.GangRequests = time.Duration((wait1-wait0)*float64(time.Second)), n1-n0
	logf("gang of %d pods created after %s (%.0f pods/s)", cfg.GangPods, r.GangCreated.Round(10*time.Millisecond), r.GangPodsPerSec)

	rayStart := time.Now()
	for i := range cfg.RayClusters {
		if err := c.Client.Create(ctx, RayCluster(ns, fmt.Sprintf("rc-%d", i))); err != nil {
			return err
		}
	}
	if err := poll(ctx, c, 10*time.Minute, func() (bool, string, error) {
		var list rayv1.RayClusterList
		if err := c.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		ready := 0
		for _, rc := range list.Items {
			if rc.Status.State == rayv1.Ready {
				ready++
			}
		}
		return ready == cfg.RayClusters, fmt.Sprintf("%d of %d RayClusters ready", ready, cfg.RayClusters), nil
	}); err != nil {
		return err
	}
	r.RayReady = time.Since(rayStart)
	logf("%d RayClusters ready after %s", cfg.RayClusters, r.RayReady.Round(10*time.Millisecond))
	return poll(ctx, c, 10*time.Minute, func() (bool, string, error) {
		var list trainingv1alpha1.TrainingJobList
		if err := c.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		running := 0
		for _, j := range list.Items {
			if meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning) {
				running++
			}
		}
		return running == len(list.Items), fmt.Sprintf("%d of %d TrainingJobs running", running, len(list.Items)), nil
	})
}

func removeWorkloads(c *framework.Cluster, ns string) {
	ctx := context.Background()
	_ = c.Client.DeleteAllOf(ctx, &trainingv1alpha1.TrainingJob{}, client.InNamespace(ns))
	_ = c.Client.DeleteAllOf(ctx, &rayv1.RayCluster{}, client.InNamespace(ns))
}

// removePolicy deletes the policy and waits until its DaemonSets are gone,
// so that a later ClusterPolicy is the one in force.
func removePolicy(c *framework.Cluster, cp *gpuv1alpha1.ClusterPolicy, ns string, logf func(string, ...any)) {
	ctx := context.Background()
	_ = c.Client.Delete(ctx, cp)
	err := poll(ctx, c, 2*time.Minute, func() (bool, string, error) {
		list := &appsv1.DaemonSetList{}
		err := c.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/managed-by": "loom"})
		return len(list.Items) == 0, fmt.Sprintf("%d operand DaemonSets left", len(list.Items)), err
	})
	if err != nil {
		logf("removing the policy: %v", err)
	}
}

// Print writes the report as one table.
func (r *Report) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	cfg := r.Config
	mib := func(b int64) string { return fmt.Sprintf("%d MiB", b>>20) }
	fmt.Fprintf(tw, "fleet\t%d simulated 8-GPU nodes, %d pods in the cluster (%d background)\n", cfg.Nodes, r.Pods, cfg.BackgroundPods)
	if len(cfg.ManagerEnv) > 0 || len(cfg.ManagerArgs) > 0 {
		fmt.Fprintf(tw, "manager run with\t%s\n", strings.Join(append(append([]string{}, cfg.ManagerEnv...), cfg.ManagerArgs...), " "))
	}
	fmt.Fprintf(tw, "inventory\t%d GPUNodes from node-agent processes (measured below), %d published by the benchmark (scaled down: %d agent processes do not fit)\n",
		min(cfg.Agents, cfg.Nodes), cfg.Nodes-min(cfg.Agents, cfg.Nodes), cfg.Nodes)
	fmt.Fprintf(tw, "workloads\t1 gang of %d pods, %d jobs of 2 × 8 GPUs, %d RayClusters of 4 pods\n", cfg.GangPods, cfg.SmallJobs, cfg.RayClusters)
	fmt.Fprintf(tw, "ClusterPolicy apply -> Ready\t%s\n", r.PolicyReady.Round(10*time.Millisecond))
	fmt.Fprintf(tw, "gang: all pods created\t%s (%.0f pods/s; client limit %s)\n", r.GangCreated.Round(10*time.Millisecond), r.GangPodsPerSec, r.ClientQPS)
	fmt.Fprintf(tw, "gang: waits for the client limit\t%s over %.0f requests\n", r.GangThrottled.Round(time.Millisecond), r.GangRequests)
	fmt.Fprintf(tw, "RayClusters: all ready\t%s\n", r.RayReady.Round(10*time.Millisecond))
	fmt.Fprintf(tw, "manager RSS start / peak / settled\t%s / %s / %s (settled: %s of it the binary's file pages)\n",
		mib(r.ManagerRSSStart), mib(r.ManagerRSSPeak), mib(r.ManagerRSS), mib(r.ManagerFileRSS))
	fmt.Fprintf(tw, "manager heap in use (settled)\t%s\n", mib(int64(r.ManagerHeap)))
	fmt.Fprintf(tw, "manager CPU: whole run / per idle minute\t%s / %s\n", r.ManagerCPU.Round(100*time.Millisecond),
		time.Duration(float64(r.ManagerIdleCPU)/cfg.Idle.Minutes()).Round(10*time.Millisecond))
	if r.AgentRuns > 0 {
		fmt.Fprintf(tw, "node agent RSS / CPU per collection\t%s (%s file pages) / %s (%d agents, %.0f collections each)\n",
			mib(r.AgentRSS), mib(r.AgentFileRSS), r.AgentCPUPerRun.Round(100*time.Microsecond), cfg.Agents, r.AgentRuns)
	}
	fmt.Fprintf(tw, "KubeRay (REFERENCE.md)\t\"500 MB for 500 Ray pods\"\n")
	minutes := cfg.Idle.Minutes()
	fmt.Fprintf(tw, "\nmanager API requests\trollout\tworkloads\tidle per minute\n")
	for _, k := range framework.SortedRequests(r.Rollout, r.Workloads, r.Idle) {
		fmt.Fprintf(tw, "%s %s\t%.0f\t%.0f\t%.1f\n", k.Verb, k.Resource, r.Rollout[k], r.Workloads[k], r.Idle[k]/minutes)
	}
	total := func(m map[framework.APIRequest]float64) (n float64) {
		for k, v := range m {
			if isWrite(k) && !strings.HasPrefix(k.Resource, "leases") {
				n += v
			}
		}
		return n
	}
	fmt.Fprintf(tw, "writes without the lease\t%.0f\t%.0f\t%.1f\n", total(r.Rollout), total(r.Workloads), total(r.Idle)/minutes)
	return tw.Flush()
}

func runtimeToMap(st *gpuv1alpha1.GPUNodeStatus) (map[string]any, error) {
	return runtime.DefaultUnstructuredConverter.ToUnstructured(st)
}
