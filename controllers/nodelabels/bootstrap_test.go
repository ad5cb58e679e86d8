package nodelabels

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/testenv"
)

// setStatus creates node's GPUNode if needed and sets its status, as the
// agent would.
func setStatus(t *testing.T, node string, st gpuv1alpha1.GPUNodeStatus) {
	t.Helper()
	ctx := context.Background()
	gn := &gpuv1alpha1.GPUNode{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, gn); err != nil {
		gn = &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: node}}
		if err := env.Client.Create(ctx, gn); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, gn); err != nil {
			return err
		}
		gn.Status = st
		return env.Client.Status().Update(ctx, gn)
	})
}

func wantLabels(t *testing.T, node string, want map[string]string, absent ...string) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() error {
		l, _ := nodeLabels(t, node)
		for k, v := range want {
			if l[k] != v {
				return fmt.Errorf("%s = %q, want %q (labels %v)", k, l[k], v, l)
			}
		}
		for _, k := range absent {
			if v, ok := l[k]; ok {
				return fmt.Errorf("%s = %q set (labels %v)", k, v, l)
			}
		}
		return nil
	})
}

func patchNode(t *testing.T, name string, edit func(*corev1.Node)) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		_, n := nodeLabels(t, name)
		edit(n)
		return env.Client.Update(context.Background(), n)
	})
}

func deletePolicies(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.DeleteAllOf(ctx, &gpuv1alpha1.ClusterPolicy{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		list := &gpuv1alpha1.ClusterPolicyList{}
		if err := env.Client.List(ctx, list); err != nil || len(list.Items) > 0 {
			return fmt.Errorf("%d ClusterPolicies left (%v)", len(list.Items), err)
		}
		return nil
	})
}

// A bare node: NFD's label alone makes it present (no GPUNode yet), and its
// going takes presence away; a GPUNode with PCI devices only gives
// presence, count and product; NVML failing afterwards changes nothing.
func TestLabellerBareNode(t *testing.T) {
	deletePolicies(t)
	startManager(t)

	createNode(t, "bare-nfd", map[string]string{gpuv1alpha1.LabelNFDPCIDisplayNVIDIA: "true", "team": "ml"})
	wantLabels(t, "bare-nfd", map[string]string{gpuv1alpha1.LabelPresent: "true"}, gpuv1alpha1.LabelCount)
	patchNode(t, "bare-nfd", func(n *corev1.Node) { delete(n.Labels, gpuv1alpha1.LabelNFDPCIDisplayNVIDIA) })
	wantLabels(t, "bare-nfd", map[string]string{"team": "ml"}, gpuv1alpha1.LabelPresent)

	createNode(t, "bare-pci", nil)
	setStatus(t, "bare-pci", gpuv1alpha1.GPUNodeStatus{PCIDevices: pciH100,
		Conditions: nvmlUnavailableStatus(gpuv1alpha1.GPUNodeStatus{}).Conditions})
	wantLabels(t, "bare-pci", map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelCount: "2", gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3"},
		gpuv1alpha1.LabelReplicas, gpuv1alpha1.LabelDriverFull, gpuv1alpha1.LabelMIGStrategy)

	// The driver arrives: NVML's inventory, GFD's full set.
	st := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(2)})
	st.PCIDevices = pciH100
	setStatus(t, "bare-pci", st)
	wantLabels(t, "bare-pci", map[string]string{gpuv1alpha1.LabelDriverFull: "550.54.15", gpuv1alpha1.LabelReplicas: "1",
		gpuv1alpha1.LabelSharingStrategy: "none", gpuv1alpha1.LabelMIGStrategy: "none"})

	// NVML goes (driver unloaded for an upgrade): the agent keeps its GPUs;
	// not one label changes, nothing is written.
	before, n := nodeLabels(t, "bare-pci")
	setStatus(t, "bare-pci", nvmlUnavailableStatus(st))
	time.Sleep(2 * time.Second)
	after, n2 := nodeLabels(t, "bare-pci")
	if !mapsEqual(before, after) || n.ResourceVersion != n2.ResourceVersion {
		t.Errorf("NVML unavailable changed the node: labels %v -> %v, rv %s -> %s", before, after, n.ResourceVersion, n2.ResourceVersion)
	}
	// Even an inventory emptied by NVML's failure takes no label away.
	setStatus(t, "bare-pci", nvmlUnavailableStatus(gpuv1alpha1.GPUNodeStatus{}))
	time.Sleep(2 * time.Second)
	if after, _ := nodeLabels(t, "bare-pci"); !mapsEqual(before, after) {
		t.Errorf("an emptied inventory with NVML unavailable changed the labels: %v -> %v", before, after)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// The device plugin's ConfigMap: the default key, then an edit of its
// content, then a node label choosing another key, then a key that does not
// parse (no label changes, a Warning event on the policy).
func TestLabellerSharingConfigMap(t *testing.T) {
	ctx := context.Background()
	deletePolicies(t)
	startManager(t)
	ns := testenv.ManagerOptions(t).Namespace
	tsConfig := func(n int) string {
		return fmt.Sprintf("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: %d\n", n)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dp-sharing"},
		Data: map[string]string{"ts2": tsConfig(2), "ts4": tsConfig(4)}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cm) })
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "labels-sharing"}, Spec: gpuv1alpha1.ClusterPolicySpec{
		DevicePlugin: gpuv1alpha1.DevicePluginSpec{Config: &gpuv1alpha1.DevicePluginConfig{ConfigMapName: cm.Name, DefaultConfig: "ts2"}}}}
	if err := env.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePolicies(t) })

	createNode(t, "shared-h100", nil)
	setStatus(t, "shared-h100", collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(2)}))
	wantLabels(t, "shared-h100", map[string]string{gpuv1alpha1.LabelReplicas: "2", gpuv1alpha1.LabelSharingStrategy: "time-slicing",
		gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3-SHARED"})

	// An edit of the content, not of the name.
	cm.Data["ts2"] = tsConfig(3)
	if err := env.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	wantLabels(t, "shared-h100", map[string]string{gpuv1alpha1.LabelReplicas: "3"})

	// The node's label picks another key.
	patchNode(t, "shared-h100", func(n *corev1.Node) { n.Labels[gpuv1alpha1.LabelDevicePluginConfig] = "ts4" })
	wantLabels(t, "shared-h100", map[string]string{gpuv1alpha1.LabelReplicas: "4"})

	// That key breaks: the labels stay, the policy gets a Warning event.
	cm.Data["ts4"] = "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}\n"
	if err := env.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		list := &eventsv1.EventList{}
		if err := env.Client.List(ctx, list); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Regarding.Name == cp.Name && e.Reason == ReasonInvalidConfig && strings.Contains(e.Note, `key "ts4"`) &&
				strings.Contains(e.Note, "replicas must be >= 2") && strings.Contains(e.Note, ns+"/dp-sharing") {
				return nil
			}
		}
		return fmt.Errorf("no %s event naming key ts4 among %d events", ReasonInvalidConfig, len(list.Items))
	})
	wantLabels(t, "shared-h100", map[string]string{gpuv1alpha1.LabelReplicas: "4", gpuv1alpha1.LabelSharingStrategy: "time-slicing",
		gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3-SHARED"})
}

// The remediation taint: added while a GPU is unhealthy, lifted when it is
// healthy again and when the option goes off; a user's taints survive
// both, including one added while Loom's was on.
func TestLabellerUnhealthyTaint(t *testing.T) {
	ctx := context.Background()
	deletePolicies(t)
	startManager(t)
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "labels-taint"},
		Spec: gpuv1alpha1.ClusterPolicySpec{Health: gpuv1alpha1.GPUHealthSpec{TaintUnhealthyNodes: true}}}
	if err := env.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePolicies(t) })

	user := corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "taint-h100"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{user}}}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	st := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(2)})
	setStatus(t, node.Name, st)
	wantLabels(t, node.Name, map[string]string{gpuv1alpha1.LabelPresent: "true"})
	wantTaints(t, node.Name, user)

	sick := *st.DeepCopy()
	sick.GPUs[1].Health = gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: "XidCriticalError", Xid: 79, Message: "Xid 79: GPU has fallen off the bus"}
	setStatus(t, node.Name, sick)
	ours := corev1.Taint{Key: gpuv1alpha1.TaintUnhealthy, Value: "XidCriticalError", Effect: corev1.TaintEffectNoSchedule}
	wantTaints(t, node.Name, user, ours)

	// Removed by hand while the GPU is still unhealthy: put back, as the
	// node lifecycle controller puts back its not-ready taint.
	patchNode(t, node.Name, func(n *corev1.Node) { n.Spec.Taints = WithTaint(n.Spec.Taints, nil) })
	wantTaints(t, node.Name, user, ours)

	// A user adds a taint while Loom's is on; the GPU recovers.
	other := corev1.Taint{Key: "maintenance", Effect: corev1.TaintEffectPreferNoSchedule}
	patchNode(t, node.Name, func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, other) })
	setStatus(t, node.Name, st)
	wantTaints(t, node.Name, user, other)

	// Unhealthy again, then the option goes off: lifted.
	setStatus(t, node.Name, sick)
	wantTaints(t, node.Name, user, other, ours)
	testenv.Eventually(t, 10*time.Second, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			return err
		}
		cp.Spec.Health.TaintUnhealthyNodes = false
		return env.Client.Update(ctx, cp)
	})
	wantTaints(t, node.Name, user, other)
}

// Loom lifts and puts back only the taint it recorded placing: a
// nvidia.com/gpu.unhealthy taint a person set is never replaced or
// lifted (nor one of another effect), and Loom's taint removed by hand
// once the GPUs are healthy again is not put back.
func TestLabellerUnhealthyTaintOwnership(t *testing.T) {
	ctx := context.Background()
	deletePolicies(t)
	startManager(t)
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "labels-taint-owner"},
		Spec: gpuv1alpha1.ClusterPolicySpec{Health: gpuv1alpha1.GPUHealthSpec{TaintUnhealthyNodes: true}}}
	if err := env.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePolicies(t) })

	person := corev1.Taint{Key: gpuv1alpha1.TaintUnhealthy, Value: "ops", Effect: corev1.TaintEffectNoSchedule}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "taint-owner"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{person}}}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	st := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(2)})
	sick := *st.DeepCopy()
	sick.GPUs[0].Health = gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: "XidCriticalError", Xid: 79}
	setStatus(t, node.Name, sick)
	wantLabels(t, node.Name, map[string]string{gpuv1alpha1.LabelPresent: "true"})
	time.Sleep(2 * time.Second) // the labeller had its chance to touch the person's taint
	wantTaints(t, node.Name, person)
	wantTaintAnnotation(t, node.Name, "")

	// The person lifts theirs while the GPU is unhealthy: Loom's comes.
	patchNode(t, node.Name, func(n *corev1.Node) { n.Spec.Taints = nil })
	ours := corev1.Taint{Key: gpuv1alpha1.TaintUnhealthy, Value: "XidCriticalError", Effect: corev1.TaintEffectNoSchedule}
	wantTaints(t, node.Name, ours)
	wantTaintAnnotation(t, node.Name, ours.Value)

	// A taint of the key with another effect is the person's: it stays
	// through Loom's lift.
	evict := corev1.Taint{Key: gpuv1alpha1.TaintUnhealthy, Value: "ops", Effect: corev1.TaintEffectNoExecute}
	patchNode(t, node.Name, func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, evict) })
	setStatus(t, node.Name, st)
	wantTaints(t, node.Name, evict)
	wantTaintAnnotation(t, node.Name, "")

	// Unhealthy again; healthy, and Loom's taint removed by hand as well:
	// the record goes, and the taint does not come back.
	setStatus(t, node.Name, sick)
	wantTaints(t, node.Name, evict, ours)
	setStatus(t, node.Name, st)
	patchNode(t, node.Name, func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{evict} })
	wantTaintAnnotation(t, node.Name, "")
	time.Sleep(2 * time.Second)
	wantTaints(t, node.Name, evict)
}

// wantTaintAnnotation waits until the node's record of Loom's taint is
// value ("": none).
func wantTaintAnnotation(t *testing.T, name, value string) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() error {
		_, n := nodeLabels(t, name)
		if got, ok := n.Annotations[AnnotationTaint]; got != value || ok != (value != "") {
			return fmt.Errorf("%s = %q (set %v), want %q", AnnotationTaint, got, ok, value)
		}
		return nil
	})
}

// wantTaints waits until the node has exactly these taints (any order),
// besides the API server's own node.kubernetes.io/ taints (not-ready on a
// Node without a kubelet): foreign taints too, which must survive.
func wantTaints(t *testing.T, name string, want ...corev1.Taint) {
	t.Helper()
	key := func(x corev1.Taint) string { return x.Key + "=" + x.Value + ":" + string(x.Effect) }
	var w []string
	for _, x := range want {
		w = append(w, key(x))
	}
	slices.Sort(w)
	testenv.Eventually(t, 20*time.Second, func() error {
		_, n := nodeLabels(t, name)
		var got []string
		for _, x := range n.Spec.Taints {
			if strings.HasPrefix(x.Key, "node.kubernetes.io/") {
				continue
			}
			got = append(got, key(x))
		}
		slices.Sort(got)
		if !slices.Equal(got, w) {
			return fmt.Errorf("taints %v, want %v", got, w)
		}
		return nil
	})
}
