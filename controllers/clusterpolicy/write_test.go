package clusterpolicy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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

// Loom's namespace missing, or deleted and terminating, is one failure
// saying so, not one per operand object the API server refuses in it.
func TestWriteNamespaceGone(t *testing.T) {
	ctx := context.Background()
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "ns-gone", UID: "ns-gone-uid"}}
	for _, tt := range []struct{ namespace, want string }{
		{"loom-missing", "namespace loom-missing does not exist: "},
		{"loom-terminating", "namespace loom-terminating is being deleted: "},
	} {
		if tt.namespace == "loom-terminating" {
			n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tt.namespace}}
			if err := env.Client.Create(ctx, n); err != nil {
				t.Fatal(err)
			}
			// No namespace controller in envtest: it stays Terminating.
			if err := env.Client.Delete(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		p := desired(cp, tt.namespace, cluster{})
		// Only the namespaced children: the cluster's are other tests'.
		p.objects = slices.DeleteFunc(p.objects, func(o client.Object) bool { return o.GetNamespace() == "" })
		errs := New(env.Client, env.Client, tt.namespace).write(ctx, cp, p, nil)
		if len(errs) != 1 || !strings.HasPrefix(errs[0], tt.want) || !strings.Contains(errs[0], fmt.Sprintf(" %d operand objects", len(p.objects))) {
			t.Errorf("%s: write errors %q, want one: %s… %d operand objects", tt.namespace, errs, tt.want, len(p.objects))
		}
	}
}
