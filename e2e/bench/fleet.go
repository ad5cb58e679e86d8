package bench

import (
	"context"
	"fmt"
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
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
	"github.com/loom-dev/loom/internal/collect"
)

// The fleet scenario's inventory and workloads.

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
		st, err := simulatedStatus(name)
		if err != nil {
			return err
		}
		gpuNode := func() *unstructured.Unstructured {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gpuv1alpha1.GroupVersion.WithKind("GPUNode"))
			u.SetName(name)
			return u
		}
		if err := c.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(gpuNode()), client.FieldOwner("loom-bench")); err != nil {
			return err
		}
		status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(st)
		if err != nil {
			return err
		}
		gn := gpuNode() // no resourceVersion: the manager adds the Node owner reference meanwhile
		gn.Object["status"] = status
		return c.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(gn), client.FieldOwner("loom-bench"), client.ForceOwnership)
	})
}

// simulatedStatus is the GPUNode status an agent would publish for node on
// a simulated DGX H100.
func simulatedStatus(node string) (*gpuv1alpha1.GPUNodeStatus, error) {
	sim, err := collect.Simulate(collect.SimOptions{System: "dgx-h100", Seed: node})
	if err != nil {
		return nil, err
	}
	if ret := sim.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("simulated NVML: %v", ret)
	}
	st, err := collect.Collect(sim, nil)
	if err != nil {
		return nil, err
	}
	st.Simulated = "dgx-h100"
	st.Conditions = []metav1.Condition{{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionTrue,
		Reason: gpuv1alpha1.ReasonCollected, Message: fmt.Sprintf("%d GPUs read through NVML", st.GPUCount),
		LastTransitionTime: metav1.Now()}}
	return &st, nil
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

func stopAgents(agents []agentProc) {
	for _, a := range agents {
		a.proc.Stop(5 * time.Second)
	}
}

// agentUse is the measured agents' CPU seconds and collections, summed,
// and their RSS, averaged, at one moment.
type agentUse struct {
	cpu, runs float64
	rss, file int64
	n         int
}

// sampleAgents reads every agent's collections (its metrics) and its
// process's CPU and RSS; an agent whose metrics do not answer is left out.
func sampleAgents(agents []agentProc) agentUse {
	var u agentUse
	for _, a := range agents {
		text, err := framework.HTTPMetrics(a.metricsURL)
		if err != nil {
			continue
		}
		n, _ := framework.MetricSum(text, "loom_node_agent_collection_duration_seconds_count")
		s, _ := framework.CPUSeconds(a.proc.PID())
		m, _ := framework.RSS(a.proc.PID())
		f, _ := framework.FileRSS(a.proc.PID())
		u.cpu, u.runs, u.rss, u.file, u.n = u.cpu+s, u.runs+n, u.rss+m, u.file+f, u.n+1
	}
	return u
}

// measureAgents sets the agents' figures from a sample taken once their
// GPUNodes were published (start) and one now: their RSS, their CPU to
// start (the process's start-up and first collections) and their CPU per
// collection after that, which is what a node pays while it runs.
func (r *Report) measureAgents(agents []agentProc, start agentUse) {
	end := sampleAgents(agents)
	if end.n == 0 || end.runs == 0 {
		return
	}
	n := float64(end.n)
	r.AgentRSS, r.AgentFileRSS = end.rss/int64(end.n), end.file/int64(end.n)
	r.AgentRuns = end.runs / n
	if start.n > 0 {
		r.AgentStartCPU, r.AgentStartRuns = seconds(start.cpu/float64(start.n)), start.runs/float64(start.n)
	}
	if runs := end.runs - start.runs; start.n == end.n && runs > 0 {
		r.AgentCPUPerRun = seconds((end.cpu - start.cpu) / runs)
	}
}

// runWorkloads submits the small jobs, then the gang, timing its pod
// creation, then the RayClusters, and waits until every job's pods run and
// every RayCluster is ready.
func (r *Report) runWorkloads(ctx context.Context, env *Env, m *Manager) error {
	cfg, c, ns := r.Config, env.Cluster, r.Config.Prefix
	obs, err := env.observe(ctx, ns)
	if err != nil {
		return err
	}
	defer obs.close()
	// Whole-node jobs first: 1-GPU gang pods spread over every node would
	// leave no node with 8 GPUs free (Loom says so on the job).
	for i := range cfg.SmallJobs {
		if err := c.Client.Create(ctx, trainingJob(ns, fmt.Sprintf("job-%d", i), 1, "8")); err != nil {
			return err
		}
	}
	if err := poll(ctx, c, 250*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
		n, _, err := obs.pods(ctx)
		return n >= 2*cfg.SmallJobs, fmt.Sprintf("%d of %d small-job pods created", n, 2*cfg.SmallJobs), err
	}); err != nil {
		return err
	}
	if err := r.runGang(ctx, env, m, obs); err != nil {
		return err
	}
	rayStart := time.Now()
	if err := createRayClusters(ctx, c, ns, cfg.RayClusters); err != nil {
		return err
	}
	if err := poll(ctx, c, 250*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
		ready, err := obs.readyRayClusters(ctx)
		return ready == cfg.RayClusters, fmt.Sprintf("%d of %d RayClusters ready", ready, cfg.RayClusters), err
	}); err != nil {
		return err
	}
	r.RayReady = time.Since(rayStart)
	env.Logf("%d RayClusters ready after %s", cfg.RayClusters, round(r.RayReady))
	return poll(ctx, c, 250*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
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

// runGang creates the gang and times its pods' creation, and how long the
// manager's requests waited for its client rate limiter meanwhile.
func (r *Report) runGang(ctx context.Context, env *Env, m *Manager, obs *observer) error {
	cfg, c, ns := r.Config, env.Cluster, r.Config.Prefix
	// The client's rate limiter records every request's wait.
	limiter := func() (wait, n float64) {
		text := m.Scrape()
		wait, _ = framework.MetricSum(text, "rest_client_rate_limiter_duration_seconds_sum")
		n, _ = framework.MetricSum(text, "rest_client_rate_limiter_duration_seconds_count")
		return wait, n
	}
	wait0, n0 := limiter()
	start := time.Now()
	if err := c.Client.Create(ctx, trainingJob(ns, "gang", int32(cfg.GangPods-1), "1")); err != nil {
		return err
	}
	if err := poll(ctx, c, 250*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
		n, _, err := obs.pods(ctx, client.MatchingLabels{trainingv1alpha1.LabelJobName: "gang"})
		return n >= cfg.GangPods, fmt.Sprintf("%d of %d gang pods created", n, cfg.GangPods), err
	}); err != nil {
		return err
	}
	r.GangCreated = time.Since(start)
	r.GangPodsPerSec = float64(cfg.GangPods) / r.GangCreated.Seconds()
	wait1, n1 := limiter()
	r.GangThrottled, r.GangRequests = seconds(wait1-wait0), n1-n0
	env.Logf("gang of %d pods created after %s (%.0f pods/s)", cfg.GangPods, round(r.GangCreated), r.GangPodsPerSec)
	return nil
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
	err := poll(ctx, c, 250*time.Millisecond, 2*time.Minute, func() (bool, string, error) {
		list := &appsv1.DaemonSetList{}
		err := c.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/managed-by": "loom"})
		return len(list.Items) == 0, fmt.Sprintf("%d operand DaemonSets left", len(list.Items)), err
	})
	if err != nil {
		logf("removing the policy: %v", err)
	}
}
