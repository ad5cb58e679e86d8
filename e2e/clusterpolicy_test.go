package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// 6 GPU nodes (one opted out of dcgm-exporter) and 2 CPU nodes: spec: {}
// rolls the default stack out on the GPU nodes only, goes Ready when every
// pod is, and deleting the policy removes everything it created.
func TestClusterPolicyRollsOutOnGPUNodes(t *testing.T) {
	ctx := context.Background()
	for i := range 6 {
		labels := map[string]string{}
		if i == 5 {
			labels["nvidia.com/gpu.deploy.dcgm-exporter"] = "false"
		}
		if _, err := cluster.CreateNode(ctx, fmt.Sprintf("cp-gpu-%d", i), framework.NodeSpec{GPUs: 8, Labels: labels}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "cp-cpu", Count: 2}); err != nil {
		t.Fatal(err)
	}
	rel, mgr := startLoomManager(t)
	for i := range 6 {
		runAgent(t, rel, framework.AgentSpec{Node: fmt.Sprintf("cp-gpu-%d", i), System: "dgx-h100"})
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		nodes := &metav1.PartialObjectMetadataList{}
		nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
		if err := cluster.Client.List(ctx, nodes, client.MatchingLabels{"nvidia.com/gpu.present": "true"}); err != nil {
			return false, err.Error()
		}
		n := 0
		for _, node := range nodes.Items {
			if strings.HasPrefix(node.Name, "cp-gpu-") {
				n++
			}
		}
		return n == 6, fmt.Sprintf("%d of 6 GPU nodes labelled", n)
	})

	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gpu-stack"}}
	applied := time.Now()
	if err := cluster.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	eventually(t, 120*time.Second, func() (bool, string) {
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(cp.Status.Conditions, "Ready")
		return cp.Status.State == gpuv1alpha1.PolicyReady, fmt.Sprintf("state %s: %+v", cp.Status.State, c)
	})
	t.Logf("ClusterPolicy Ready %s after apply", time.Since(applied).Round(10*time.Millisecond))
	if cp.Status.GPUNodes < 6 {
		t.Errorf("status counts %d GPU nodes", cp.Status.GPUNodes)
	}
	// MIG as the node agents report it: six MIG-capable H100 nodes, none
	// in MIG mode, under the default single strategy.
	if m := cp.Status.MIG; m == nil || m.CapableNodes < 6 || m.EnabledNodes != 0 || m.Strategy != gpuv1alpha1.MIGStrategySingle {
		t.Errorf("status.mig = %+v", m)
	}
	for _, c := range cp.Status.Components {
		switch {
		case !c.Enabled:
		case c.Name == "dcgm-exporter" && c.Desired != cp.Status.GPUNodes-1:
			t.Errorf("dcgm-exporter desired on %d nodes, want %d (one opted out)", c.Desired, cp.Status.GPUNodes-1)
		case c.Name != "dcgm-exporter" && c.Desired != cp.Status.GPUNodes:
			t.Errorf("%s desired on %d nodes, want %d", c.Name, c.Desired, cp.Status.GPUNodes)
		}
	}
	pods := &corev1.PodList{}
	if err := cluster.Client.List(ctx, pods, client.InNamespace(loomNS), client.MatchingLabels{"app.kubernetes.io/managed-by": "loom"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Spec.NodeName, "cp-cpu") {
			t.Errorf("operand pod %s on CPU node %s", p.Name, p.Spec.NodeName)
		}
		if p.Spec.NodeName == "cp-gpu-5" && p.Labels["app.kubernetes.io/component"] == "dcgm-exporter" {
			t.Errorf("dcgm-exporter pod on the opted-out node")
		}
	}

	if body := managerMetrics(t, mgr); !strings.Contains(body, `loom_clusterpolicy_ready{policy="gpu-stack"} 1`) ||
		!strings.Contains(body, `loom_clusterpolicy_component_ready_nodes{component="driver"} 6`) {
		t.Errorf("ClusterPolicy metrics missing or wrong")
	}

	// Idle: the manager writes nothing but its leader-election lease.
	time.Sleep(3 * time.Second) // let the rollout's last status events settle
	before := managerRequests(t, mgr)
	const idle = 20 * time.Second
	time.Sleep(idle)
	after := managerRequests(t, mgr)
	var writes, leaseWrites, reads float64
	for k, v := range after {
		d := v - before[k]
		switch {
		case d == 0:
		case k.Resource == "leases":
			leaseWrites += d
		case k.Verb == "get" || k.Verb == "list" || k.Verb == "watch":
			reads += d
		default:
			writes += d
			t.Errorf("idle write: %s %s ×%v", k.Verb, k.Resource, d)
		}
	}
	t.Logf("idle %s with the policy Ready on %d GPU nodes: %v writes, %v lease requests, %v other reads", idle, cp.Status.GPUNodes, writes, leaseWrites, reads)

	// A driver version change rolls node by node, at most 2 at a time; a
	// node cordoned beforehand stays cordoned; GPU pods are evicted first.
	testDriverUpgrade(t, cp)
	// A PodDisruptionBudget holds a node's upgrade; a manager restart in the
	// middle resumes it.
	testUpgradeHeldByPDBSurvivesRestart(t, cp, mgr)
	// waitForCompletion holds a node until its jobs end; drain evicts the
	// selected pods; a pod deletion past its timeout fails that node alone.
	testUpgradeWaitsDrainsAndFails(t, cp)

	// Deleting the policy removes what it created.
	if err := cluster.Client.Delete(ctx, cp); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		list := &appsv1.DaemonSetList{}
		if err := cluster.Client.List(ctx, list, client.InNamespace(loomNS), client.MatchingLabels{"app.kubernetes.io/managed-by": "loom"}); err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d operand DaemonSets left", len(list.Items))
	})
	if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: loomNS, Name: "loom-driver"}, &corev1.ServiceAccount{}); !apierrors.IsNotFound(err) {
		eventually(t, 30*time.Second, func() (bool, string) {
			err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: loomNS, Name: "loom-driver"}, &corev1.ServiceAccount{})
			return apierrors.IsNotFound(err), "driver ServiceAccount left"
		})
	}
}

func managerMetrics(t *testing.T, m *framework.Manager) string {
	t.Helper()
	text, err := m.Metrics(adminToken(t))
	if err != nil {
		t.Fatal(err)
	}
	return text
}

func managerRequests(t *testing.T, m *framework.Manager) map[framework.APIRequest]float64 {
	t.Helper()
	reqs, err := m.APIRequests(adminToken(t))
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func testDriverUpgrade(t *testing.T, cp *gpuv1alpha1.ClusterPolicy) {
	ctx := context.Background()
	const cordoned = "cp-gpu-3"
	patchNode(t, cordoned, `{"spec":{"unschedulable":true}}`)
	gpuPod := gpuPod("default", "training-on-cp-gpu-0", 8)
	gpuPod.Spec.NodeName = "cp-gpu-0"
	if err := cluster.Client.Create(ctx, gpuPod); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		p := &corev1.Pod{}
		err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(gpuPod), p)
		return err == nil && p.Status.Phase == corev1.PodRunning, "GPU pod not running"
	})

	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cp.DeepCopy())
	cp.Spec.Driver.Image.Version = "580.65.06"
	cp.Spec.Driver.UpgradePolicy.MaxParallelUpgrades = ptr.To[int32](2)
	// The test's GPU pods are bare pods: force evicts them.
	cp.Spec.Driver.UpgradePolicy.PodDeletion = &gpuv1alpha1.PodDeletionSpec{Force: true, TimeoutSeconds: 300}
	if err := cluster.Client.Patch(ctx, cp, patch); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	maxInProgress := 0
	deadline := time.Now().Add(3 * time.Minute)
	for {
		nodes := &corev1.NodeList{}
		if err := cluster.Client.List(ctx, nodes); err != nil {
			t.Fatal(err)
		}
		inProgress, done, failed := 0, 0, 0
		for _, n := range nodes.Items {
			if !strings.HasPrefix(n.Name, "cp-gpu-") {
				continue
			}
			switch n.Labels["nvidia.com/gpu-driver-upgrade-state"] {
			case "", "upgrade-done":
				if n.Labels["nvidia.com/gpu-driver-upgrade-state"] == "upgrade-done" {
					done++
				}
			case "upgrade-failed":
				failed++
			default:
				inProgress++
			}
		}
		maxInProgress = max(maxInProgress, inProgress)
		if failed > 0 {
			t.Fatalf("%d nodes failed their driver upgrade", failed)
		}
		if done == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver upgrade: %d of 6 nodes done after 3m (%d in progress)", done, inProgress)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("driver upgrade of 6 nodes done in %s, at most %d at once", time.Since(started).Round(100*time.Millisecond), maxInProgress)
	if maxInProgress > 2 {
		t.Errorf("%d nodes upgraded at once, max parallel is 2", maxInProgress)
	}
	pods := &corev1.PodList{}
	if err := cluster.Client.List(ctx, pods, client.InNamespace(loomNS), client.MatchingLabels{"app.kubernetes.io/component": "driver"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Spec.NodeName, "cp-gpu-") && p.Spec.Containers[0].Image != "nvcr.io/nvidia/driver:580.65.06-ubuntu22.04" {
			t.Errorf("driver pod on %s runs %s", p.Spec.NodeName, p.Spec.Containers[0].Image)
		}
	}
	for i := range 6 {
		n := &corev1.Node{}
		name := fmt.Sprintf("cp-gpu-%d", i)
		if err := cluster.Client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			t.Fatal(err)
		}
		if n.Spec.Unschedulable != (name == cordoned) {
			t.Errorf("node %s unschedulable = %v after the upgrade", name, n.Spec.Unschedulable)
		}
	}
	p := &corev1.Pod{}
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(gpuPod), p); !apierrors.IsNotFound(err) && p.DeletionTimestamp == nil {
		t.Errorf("GPU pod on an upgraded node was not evicted (phase %s, err %v)", p.Status.Phase, err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		_ = cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp)
		return cp.Status.State == gpuv1alpha1.PolicyReady, "policy not Ready after the upgrade: " + fmt.Sprint(cp.Status.Conditions)
	})
	patchNode(t, cordoned, `{"spec":{"unschedulable":false}}`)
}

func testUpgradeHeldByPDBSurvivesRestart(t *testing.T, cp *gpuv1alpha1.ClusterPolicy, mgr *framework.Manager) {
	ctx := context.Background()
	pinned := gpuPod("default", "pinned-on-cp-gpu-1", 8)
	pinned.Labels = map[string]string{"app": "pinned"}
	pinned.Spec.NodeName = "cp-gpu-1"
	if err := cluster.Client.Create(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pinned"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "pinned"}}},
	}
	if err := cluster.Client.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		p := &corev1.Pod{}
		_ = cluster.Client.Get(ctx, client.ObjectKeyFromObject(pinned), p)
		got := &policyv1.PodDisruptionBudget{}
		_ = cluster.Client.Get(ctx, client.ObjectKeyFromObject(pdb), got)
		return p.Status.Phase == corev1.PodRunning && got.Status.CurrentHealthy == 1, "pinned pod not running under its PDB yet"
	})

	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cp.DeepCopy())
	cp.Spec.Driver.Image.Version = "580.82.07"
	if err := cluster.Client.Patch(ctx, cp, patch); err != nil {
		t.Fatal(err)
	}
	state := func(node string) string {
		n := &corev1.Node{}
		_ = cluster.Client.Get(ctx, client.ObjectKey{Name: node}, n)
		return n.Labels["nvidia.com/gpu-driver-upgrade-state"]
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		return state("cp-gpu-1") == "pod-deletion-required", "cp-gpu-1 in state " + state("cp-gpu-1")
	})
	time.Sleep(4 * time.Second)
	if s := state("cp-gpu-1"); s != "pod-deletion-required" {
		t.Fatalf("cp-gpu-1 went on to %s although its pod's PDB forbids the eviction", s)
	}
	p := &corev1.Pod{}
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(pinned), p); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("PDB-protected pod was removed (%v)", err)
	}

	// Restart the manager mid-upgrade, then release the budget.
	mgr.Stop(20 * time.Second)
	startLoomManager(t)
	if err := cluster.Client.Delete(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	eventually(t, 120*time.Second, func() (bool, string) {
		for i := range 6 {
			if s := state(fmt.Sprintf("cp-gpu-%d", i)); s != "upgrade-done" {
				return false, fmt.Sprintf("cp-gpu-%d in %q", i, s)
			}
		}
		return true, ""
	})
	pods := &corev1.PodList{}
	if err := cluster.Client.List(ctx, pods, client.InNamespace(loomNS), client.MatchingLabels{"app.kubernetes.io/component": "driver"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Spec.NodeName, "cp-gpu-") && p.Spec.Containers[0].Image != "nvcr.io/nvidia/driver:580.82.07-ubuntu22.04" {
			t.Errorf("driver pod on %s runs %s after the resumed upgrade", p.Spec.NodeName, p.Spec.Containers[0].Image)
		}
	}
}

func testUpgradeWaitsDrainsAndFails(t *testing.T, cp *gpuv1alpha1.ClusterPolicy) {
	ctx := context.Background()
	bare := func(name, node string, labels map[string]string, gpus int64) *corev1.Pod {
		p := gpuPod("default", name, gpus)
		if gpus == 0 {
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		}
		p.Labels, p.Spec.NodeName = labels, node
		if err := cluster.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	job := bare("batch-job", "cp-gpu-2", map[string]string{"loom-e2e/job": "batch"}, 0)
	stuck := bare("stuck", "cp-gpu-4", map[string]string{"app": "stuck"}, 8)
	drainMe := bare("drain-me", "cp-gpu-5", map[string]string{"loom-e2e/drain": "yes"}, 0)
	stays := bare("stays", "cp-gpu-5", nil, 0)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "stuck"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "stuck"}}},
	}
	if err := cluster.Client.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		got := &policyv1.PodDisruptionBudget{}
		_ = cluster.Client.Get(ctx, client.ObjectKeyFromObject(pdb), got)
		return got.Status.CurrentHealthy == 1, "PDB not healthy yet"
	})

	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cp.DeepCopy())
	cp.Spec.Driver.Image.Version = "580.95.05"
	cp.Spec.Driver.UpgradePolicy.MaxParallelUpgrades = ptr.To[int32](0)
	cp.Spec.Driver.UpgradePolicy.MaxUnavailable = ptr.To(intstr.FromString("100%"))
	cp.Spec.Driver.UpgradePolicy.WaitForCompletion = &gpuv1alpha1.WaitForCompletionSpec{PodSelector: "loom-e2e/job=batch"}
	cp.Spec.Driver.UpgradePolicy.PodDeletion = &gpuv1alpha1.PodDeletionSpec{Force: true, TimeoutSeconds: 3}
	cp.Spec.Driver.UpgradePolicy.Drain = &gpuv1alpha1.DrainSpec{Enable: true, Force: true, PodSelector: "loom-e2e/drain=yes", TimeoutSeconds: 60}
	if err := cluster.Client.Patch(ctx, cp, patch); err != nil {
		t.Fatal(err)
	}
	node := func(name string) *corev1.Node {
		n := &corev1.Node{}
		_ = cluster.Client.Get(ctx, client.ObjectKey{Name: name}, n)
		return n
	}
	want := map[string]string{"cp-gpu-0": "upgrade-done", "cp-gpu-1": "upgrade-done", "cp-gpu-2": "wait-for-jobs-required",
		"cp-gpu-3": "upgrade-done", "cp-gpu-4": "upgrade-failed", "cp-gpu-5": "upgrade-done"}
	eventually(t, 120*time.Second, func() (bool, string) {
		for name, s := range want {
			if got := node(name).Labels["nvidia.com/gpu-driver-upgrade-state"]; got != s {
				return false, fmt.Sprintf("%s in %q, want %q", name, got, s)
			}
		}
		return true, ""
	})
	failed := node("cp-gpu-4")
	if why := failed.Annotations["gpu.loom.dev/driver-upgrade-failure"]; !strings.Contains(why, "podDeletion.timeoutSeconds") {
		t.Errorf("cp-gpu-4 failure annotation %q", why)
	}
	if !failed.Spec.Unschedulable {
		t.Error("a node whose upgrade failed was uncordoned")
	}
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(drainMe), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		p := &corev1.Pod{}
		_ = cluster.Client.Get(ctx, client.ObjectKeyFromObject(drainMe), p)
		if p.DeletionTimestamp == nil {
			t.Errorf("drain left the selected pod drain-me (err %v)", err)
		}
	}
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(stays), &corev1.Pod{}); err != nil {
		t.Errorf("drain removed a pod its selector does not match: %v", err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		_ = cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp)
		for _, c := range cp.Status.Components {
			if c.Name == "driver" {
				return strings.Contains(c.Message, "cp-gpu-4: GPU pods still on the node"), "driver component: " + c.Message
			}
		}
		return false, "no driver component"
	})

	// The job ends: its node goes on.
	if err := cluster.Client.Delete(ctx, job, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		s := node("cp-gpu-2").Labels["nvidia.com/gpu-driver-upgrade-state"]
		return s == "upgrade-done", "cp-gpu-2 in " + s
	})
	for _, o := range []client.Object{pdb, stuck, stays} {
		_ = cluster.Client.Delete(ctx, o, client.GracePeriodSeconds(0))
	}
	// The failed node is retried by the next version and finishes.
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	patch = client.MergeFrom(cp.DeepCopy())
	cp.Spec.Driver.Image.Version = "580.105.08"
	if err := cluster.Client.Patch(ctx, cp, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, func() (bool, string) {
		n := node("cp-gpu-4")
		s := n.Labels["nvidia.com/gpu-driver-upgrade-state"]
		return s == "upgrade-done" && !n.Spec.Unschedulable && n.Annotations["gpu.loom.dev/driver-upgrade-failure"] == "", "cp-gpu-4 in " + s
	})
}

func patchNode(t *testing.T, name, patch string) {
	t.Helper()
	n := &corev1.Node{}
	n.Name = name
	if err := cluster.Client.Patch(context.Background(), n, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}
