package main

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/why"
)

// The plugin calls GPUs what the manager does: the resource the
// ClusterPolicy's device plugin config renames (nvidia.com/small, read
// from its ConfigMap in Loom's namespace) is one; the network operator's
// nvidia.com/rdma_shared and nvidia.com/mlnxnics are not.
func TestGPUResourcesAreTheSharingConfigs(t *testing.T) {
	ctx := context.Background()
	const loomNS, ns = "loom-sharing", "nic-team"
	for _, n := range []string{loomNS, ns} {
		if err := env.CreateNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "sharing"}}
	cp.Spec.DevicePlugin.Config = &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "device-plugin", DefaultConfig: "small"}
	if err := env.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, cp) })
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "device-plugin", Namespace: loomNS}, Data: map[string]string{
		"small": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      rename: nvidia.com/small\n      replicas: 4\n"}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	// The policy's device plugin DaemonSet says where Loom runs.
	labels := map[string]string{gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDevicePlugin}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-device-plugin", Namespace: loomNS,
		Labels:          map[string]string{gpuv1alpha1.LabelPolicy: cp.Name, apply.LabelManagedBy: apply.ManagedBy},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: gpuv1alpha1.GroupVersion.String(), Kind: "ClusterPolicy", Name: cp.Name, UID: cp.UID, Controller: ptr.To(true)}}},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "p", Image: "x"}}}}}}
	if err := env.Client.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	nics := corev1.ResourceList{"nvidia.com/rdma_shared": resource.MustParse("4"), "nvidia.com/mlnxnics": resource.MustParse("2")}
	node := func(name string, labels map[string]string, alloc corev1.ResourceList) {
		t.Helper()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		if err := env.Client.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, n) })
		n.Spec.Taints = nil // the API server's not-ready taint, which no kubelet lifts here
		if err := env.Client.Update(ctx, n); err != nil {
			t.Fatal(err)
		}
		n.Status.Capacity, n.Status.Allocatable = alloc, alloc
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		if err := env.Client.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	node("nic-only", nil, nics)
	shared := nics.DeepCopy()
	shared["nvidia.com/small"] = resource.MustParse("16")
	node("shared-1", map[string]string{gpuv1alpha1.LabelPresent: "true"}, shared)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: ns}, Spec: corev1.PodSpec{NodeName: "shared-1",
		Containers: []corev1.Container{{Name: "c", Image: "x", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			"nvidia.com/small": resource.MustParse("12"), "nvidia.com/rdma_shared": resource.MustParse("1")}}}}}}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}

	out, err := run(t, "gpus", "-o", "wide")
	if err != nil {
		t.Fatalf("gpus: %v", err)
	}
	if strings.Contains(out, "nic-only") || strings.Contains(out, "rdma_shared") || strings.Contains(out, "mlnxnics") {
		t.Errorf("gpus counts a NIC as a GPU:\n%s", out)
	}
	row := strings.Join(strings.Fields(lastLine(out, "shared-1")), " ")
	if want := "shared-1 - 0 0 nvidia.com/small 16 12 4 - true nic-team/holder=12"; row != want {
		t.Errorf("gpus row\n got %q\nwant %q\n%s", row, want, out)
	}
	out, err = run(t, "why", "node/shared-1")
	if err != nil || !strings.Contains(out, "16 nvidia.com/small allocatable") || strings.Contains(out, "rdma") {
		t.Errorf("why node: %v\n%s", err, out)
	}

	// A waiting job asking 8 shared GPUs and 4 NICs per pod: the advice and
	// the live picture are about the shared GPUs.
	tj := &trainingv1alpha1.TrainingJob{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: ns}}
	tj.Spec.ReplicaSpecs.Master = trainingv1alpha1.ReplicaSpec{Replicas: ptr.To[int32](1), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "train", Image: "pytorch", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			"nvidia.com/small": resource.MustParse("8"), "nvidia.com/rdma_shared": resource.MustParse("32")}}}}}}}
	if err := env.Client.Create(ctx, tj); err != nil {
		t.Fatal(err)
	}
	now := metav1.NewTime(time.Now())
	tj.Status.State, tj.Status.ObservedGeneration = trainingv1alpha1.StatePending, tj.Generation
	tj.Status.Conditions = []metav1.Condition{{Type: trainingv1alpha1.ConditionScheduled, Status: metav1.ConditionFalse,
		Reason: why.ReasonNeverFits, Message: "it can never fit", LastTransitionTime: now}}
	if err := env.Client.Status().Update(ctx, tj); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "why", "tj/shared", "-n", ns)
	if err != nil {
		t.Fatalf("why: %v", err)
	}
	if !strings.Contains(out, "(now 8 nvidia.com/small)") || !strings.Contains(out, "GPUs now: nvidia.com/small: 4 free on 1 node") {
		t.Errorf("why a job asking shared GPUs and NICs:\n%s", out)
	}
}
