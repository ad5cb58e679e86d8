package clusterpolicy

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
)

// A RuntimeClass an admin (or the toolkit) made is theirs: not touched, and
// not a failure. Any other child of the name Loom does not control is.
func TestWriteLeavesForeignChildren(t *testing.T) {
	ctx := context.Background()
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", UID: "cp-uid"}}
	cp.Spec.Driver.Image.Version = "570.172.08-ubuntu22.04" // one driver DaemonSet for every OS
	admins := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: RuntimeClassName}, Handler: "nvidia-cdi"}
	users := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-dcgm-exporter"}}
	c := fake.NewClientBuilder().WithScheme(manager.Scheme()).WithObjects(cp, admins, users).Build()
	r := New(c, c, "loom-system")

	errs := r.write(ctx, cp, desired(cp, "loom-system", cluster{}), nil)
	if len(errs) != 1 || !strings.Contains(errs[0], "DaemonSet loom-system/loom-dcgm-exporter exists and is not managed by Loom") {
		t.Errorf("write errors %q, want one for the user's DaemonSet", errs)
	}
	rc := &nodev1.RuntimeClass{}
	if err := c.Get(ctx, client.ObjectKey{Name: RuntimeClassName}, rc); err != nil || rc.Handler != "nvidia-cdi" || len(rc.OwnerReferences) != 0 {
		t.Errorf("the admin's RuntimeClass changed: %+v (%v)", rc, err)
	}
	ds := &appsv1.DaemonSet{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "loom-system", Name: "loom-driver"}, ds); err != nil || !metav1.IsControlledBy(ds, cp) {
		t.Errorf("the driver DaemonSet was not written: %v", err)
	}
}
