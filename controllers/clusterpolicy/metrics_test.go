package clusterpolicy

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
)

// The gauges of the policy in force go with it: once the stack is
// uninstalled, LoomGPUExporterAbsent (dcgm-exporter desired on nodes) and
// LoomGPUOperandNotReady (desired minus ready) must not fire on what it
// last reported. A policy being deleted (foreground deletion, Argo CD's
// default) is no longer in force and is not reported as ignored in favour
// of none. Another policy's deletion leaves the gauges alone.
func TestMetricsGoWithThePolicy(t *testing.T) {
	ctx := context.Background()
	deleting := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deleting", UID: "cp-uid",
		DeletionTimestamp: &metav1.Time{Time: metav1.Now().Time}, Finalizers: []string{"foregroundDeletion"}}}
	c := fake.NewClientBuilder().WithScheme(manager.Scheme()).WithObjects(deleting).WithStatusSubresource(deleting).Build()
	r := New(c, c, "loom-system")
	req := func(name string) ctrl.Request { return ctrl.Request{NamespacedName: types.NamespacedName{Name: name}} }
	rolling := allRolledOut(3)
	rolling["dcgm-exporter"].Status.NumberReady = 1
	record := func(name string) {
		cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}
		recordMetrics(name, status(cp, observed{active: name, gpuNodes: 3, daemonSets: rolling}, nil))
	}
	gauges := func() int {
		return testutil.CollectAndCount(policyReady) + testutil.CollectAndCount(componentDesired) + testutil.CollectAndCount(componentReady)
	}

	record("default")
	if _, err := r.Reconcile(ctx, req("gone-other")); err != nil {
		t.Fatal(err)
	}
	if gauges() == 0 {
		t.Error("deleting a policy not in force cleared the gauges of the one in force")
	}
	if _, err := r.Reconcile(ctx, req("default")); err != nil {
		t.Fatal(err)
	}
	if n := gauges(); n != 0 {
		t.Errorf("%d gauges of the deleted policy in force left", n)
	}

	record("deleting")
	if _, err := r.Reconcile(ctx, req("deleting")); err != nil {
		t.Fatal(err)
	}
	if n := gauges(); n != 0 {
		t.Errorf("%d gauges of the policy being deleted left", n)
	}
	got := &gpuv1alpha1.ClusterPolicy{}
	if err := c.Get(ctx, req("deleting").NamespacedName, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.State == gpuv1alpha1.PolicyIgnored {
		t.Errorf("a policy being deleted reads ignored in favour of %q: %+v", got.Status.ActivePolicy, got.Status.Conditions)
	}
}
