package driverupgrade

import (
	"context"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
)

// The reconciler executes next's actions against the API (a fake client,
// no API server) and a fake clock: one node goes through every state, its
// GPU pod is evicted, its driver pod replaced, and it ends schedulable.
func TestReconcileUpgradesANode(t *testing.T) {
	ctx := context.Background()
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", UID: "cp-uid"}}
	cp.Spec.Driver.UpgradePolicy = gpuv1alpha1.DriverUpgradePolicy{PodDeletion: &gpuv1alpha1.PodDeletionSpec{Force: true, TimeoutSeconds: 300}}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: "loom-driver", Generation: 2,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: gpuv1alpha1.GroupVersion.String(), Kind: "ClusterPolicy", Name: "default", UID: "cp-uid", Controller: ptr.To(true)}}}}
	ds.Spec.Template.Annotations = map[string]string{gpuv1alpha1.AnnotationTemplateHash: wanted}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-0", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}}}
	workload := pod("training", gpus)
	workload.Spec.NodeName = "gpu-0"
	c := fake.NewClientBuilder().WithScheme(manager.Scheme()).
		WithObjects(cp, ds, n, &workload, scheduledDriver("old-template")).
		WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
		Build()
	clock := t0
	r := New(c, c, loomNS)
	r.Now = func() time.Time { return clock }

	var states []string
	for range 20 {
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ds)})
		if err != nil {
			t.Fatal(err)
		}
		playDaemonSetController(t, c)
		got := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(n), got); err != nil {
			t.Fatal(err)
		}
		if s := got.Labels[gpuv1alpha1.LabelUpgradeState]; len(states) == 0 || states[len(states)-1] != s {
			states = append(states, s)
		}
		if states[len(states)-1] == gpuv1alpha1.UpgradeDone {
			if got.Spec.Unschedulable || len(got.Annotations) != 0 {
				t.Errorf("done: unschedulable %v, annotations %v", got.Spec.Unschedulable, got.Annotations)
			}
			if res, err = r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ds)}); err != nil || res.RequeueAfter != 0 {
				t.Errorf("after the upgrade: requeue %s, %v", res.RequeueAfter, err)
			}
			break
		}
		clock = clock.Add(time.Second)
	}
	want := []string{gpuv1alpha1.UpgradeRequired, gpuv1alpha1.WaitForJobsRequired, gpuv1alpha1.PodDeletionRequired, gpuv1alpha1.DrainRequired,
		gpuv1alpha1.PodRestartRequired, gpuv1alpha1.ValidationRequired, gpuv1alpha1.UncordonRequired, gpuv1alpha1.UpgradeDone}
	if !slices.Equal(states, want) {
		t.Errorf("states %v\nwant %v", states, want)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(&workload), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("the GPU pod was not evicted (%v)", err)
	}
}

func scheduledDriver(template string) *corev1.Pod {
	p := driverPod(template, true)
	p.Labels = map[string]string{"app.kubernetes.io/managed-by": "loom", gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}
	p.Spec.NodeName = "gpu-0"
	return p
}

// playDaemonSetController replaces a deleted driver pod with one of the
// wanted template (envtest and the fake client run no controllers).
func playDaemonSetController(t *testing.T, c client.Client) {
	t.Helper()
	err := c.Get(context.Background(), client.ObjectKey{Namespace: loomNS, Name: "loom-driver-x"}, &corev1.Pod{})
	if apierrors.IsNotFound(err) {
		err = c.Create(context.Background(), scheduledDriver(wanted))
	}
	if err != nil {
		t.Fatal(err)
	}
}
