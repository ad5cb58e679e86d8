package clusterpolicy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/daemonplace"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// GPU Operator's driver manager stops only the operands whose
// nvidia.com/gpu.deploy.<operand> is true on its node: Loom sets the
// missing ones (none, or empty) to true for the enabled operands it stops,
// on the nodes Loom's driver runs on, and keeps every value someone set.
func TestMissingDeployLabels(t *testing.T) {
	defaultOn := []string{"container-toolkit", "device-plugin", "dcgm-exporter", "mig-manager", "operator-validator"}
	for _, tt := range []struct {
		name   string
		labels map[string]string
		edit   func(*gpuv1alpha1.ClusterPolicy)
		want   []string
	}{
		{name: "unlabelled GPU node", want: defaultOn},
		{name: "standalone DCGM on", edit: func(cp *gpuv1alpha1.ClusterPolicy) { cp.Spec.DCGM.Enabled = ptr.To(true) },
			want: []string{"container-toolkit", "dcgm", "device-plugin", "dcgm-exporter", "mig-manager", "operator-validator"}},
		{name: "values kept", labels: map[string]string{"nvidia.com/gpu.deploy.device-plugin": "false",
			"nvidia.com/gpu.deploy.dcgm-exporter": "paused-for-driver-upgrade", "nvidia.com/gpu.deploy.mig-manager": "true",
			"nvidia.com/gpu.deploy.container-toolkit": ""},
			want: []string{"container-toolkit", "operator-validator"}},
		{name: "host driver", labels: map[string]string{"nvidia.com/gpu.deploy.driver": "pre-installed"}},
		{name: "driver off", edit: func(cp *gpuv1alpha1.ClusterPolicy) { cp.Spec.Driver.Enabled = ptr.To(false) }},
		{name: "all labelled", labels: map[string]string{"nvidia.com/gpu.deploy.container-toolkit": "true", "nvidia.com/gpu.deploy.device-plugin": "true",
			"nvidia.com/gpu.deploy.dcgm-exporter": "true", "nvidia.com/gpu.deploy.mig-manager": "true", "nvidia.com/gpu.deploy.operator-validator": "true"}},
	} {
		cp := &gpuv1alpha1.ClusterPolicy{}
		if tt.edit != nil {
			tt.edit(cp)
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}}}
		maps.Copy(n.Labels, tt.labels)
		got := missingDeployLabels(cp, n)
		var want map[string]string
		for _, op := range tt.want {
			if want == nil {
				want = map[string]string{}
			}
			want["nvidia.com/gpu.deploy."+op] = "true"
		}
		if !maps.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("%s: %v, want %v", tt.name, got, want)
		}
	}
}

// The GPU nodes get the deploy labels once, a value set afterwards (the
// driver manager's pause, a person's false) is kept, and a removed one
// comes back.
func testDeployLabels(t *testing.T) {
	ctx := context.Background()
	labelled := func(node string) (map[string]string, error) {
		n := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			return nil, err
		}
		return n.Labels, nil
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		for _, node := range []string{"cp-gpu-0", "cp-gpu-1"} {
			l, err := labelled(node)
			if err != nil {
				return err
			}
			for _, op := range managerPaused {
				if v, want := l["nvidia.com/gpu.deploy."+op], map[bool]string{true: "true"}[op != "dcgm"]; v != want {
					return fmt.Errorf("%s: nvidia.com/gpu.deploy.%s=%q, want %q", node, op, v, want)
				}
			}
		}
		if l, err := labelled("cp-cpu"); err != nil || slices.ContainsFunc(slices.Collect(maps.Keys(l)), func(k string) bool { return len(k) > 22 && k[:22] == "nvidia.com/gpu.deploy." }) {
			return fmt.Errorf("cp-cpu labels %v (%v)", l, err)
		}
		return nil
	})
	// Counted among the writes (loom_writes_total) as every other of Loom's.
	if n := testenv.WritesCounted(t, "Node", FieldOwner, "patch", "written"); n < 2 {
		t.Errorf("loom_writes_total counts %v Node patches, want one per labelled GPU node at least", n)
	}
	patch := func(body string) {
		t.Helper()
		if err := env.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-gpu-1"}}, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
			t.Fatal(err)
		}
	}
	patch(`{"metadata":{"labels":{"nvidia.com/gpu.deploy.device-plugin":"paused-for-driver-upgrade","nvidia.com/gpu.deploy.mig-manager":"false","nvidia.com/gpu.deploy.dcgm-exporter":null}}}`)
	testenv.Eventually(t, 20*time.Second, func() error {
		l, err := labelled("cp-gpu-1")
		if err != nil || l["nvidia.com/gpu.deploy.dcgm-exporter"] != "true" {
			return fmt.Errorf("removed dcgm-exporter label not set again: %v (%v)", l, err)
		}
		return nil
	})
	if l, _ := labelled("cp-gpu-1"); l["nvidia.com/gpu.deploy.device-plugin"] != "paused-for-driver-upgrade" || l["nvidia.com/gpu.deploy.mig-manager"] != "false" {
		t.Errorf("values set on the node overwritten: %v", l)
	}
	patch(`{"metadata":{"labels":{"nvidia.com/gpu.deploy.device-plugin":"true","nvidia.com/gpu.deploy.mig-manager":"true"}}}`)
}

// A GPU node's gpu.loom.dev/driver-target is its driver DaemonSet's target:
// set, corrected (its OS changed, a hand edit) and removed where it has no
// driver, and a node whose labels are right gets no patch.
func TestNodeTargetLabel(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	all := map[string]string{gpuv1alpha1.LabelPresent: "true"}
	for _, op := range []string{"container-toolkit", "device-plugin", "dcgm-exporter", "mig-manager", "operator-validator"} {
		all["nvidia.com/gpu.deploy."+op] = "true"
	}
	with := func(target string) map[string]string {
		l := maps.Clone(all)
		if target != "" {
			l[gpuv1alpha1.LabelDriverTarget] = target
		}
		return l
	}
	for _, tt := range []struct {
		name      string
		labels    map[string]string
		target    string
		want      *string
		wantPatch bool
	}{
		{name: "new node", labels: with(""), target: "ubuntu22.04", want: ptr.To("ubuntu22.04"), wantPatch: true},
		{name: "its OS changed", labels: with("ubuntu22.04"), target: "ubuntu24.04", want: ptr.To("ubuntu24.04"), wantPatch: true},
		{name: "no driver any more", labels: with("ubuntu22.04"), target: "", want: nil, wantPatch: true},
		{name: "right", labels: with("ubuntu22.04"), target: "ubuntu22.04"},
		{name: "none, none wanted", labels: with(""), target: ""},
	} {
		got := nodeLabels(cp, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a", Labels: tt.labels}}, tt.target)
		if (got != nil) != tt.wantPatch {
			t.Errorf("%s: patch %v, want one %v", tt.name, got, tt.wantPatch)
			continue
		}
		if v, ok := got[gpuv1alpha1.LabelDriverTarget]; tt.wantPatch && (!ok || (v == nil) != (tt.want == nil) || (v != nil && *v != *tt.want)) {
			t.Errorf("%s: driver target %v (set %v), want %v", tt.name, v, ok, tt.want)
		}
	}
}

// A node's target label goes in a pass before the driver DaemonSet that
// places it by that label: a pass that sets it, or fails to (a conflict, a
// refusal), leaves the driver DaemonSets as they are, while the other
// operands are written; the pass after it writes them. Written first, the
// DaemonSet would have its controller delete the unlabelled node's driver
// pod.
func TestNodesLabelledBeforeTheDriverDaemonSet(t *testing.T) {
	ctx := context.Background()
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", UID: "cp-uid"}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}},
		Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS"}}}
	old := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-driver-ubuntu22.04",
		Labels: map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}}}
	refuse := true
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(manager.Scheme()).WithObjects(cp, node, old).Build(), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Node); ok && refuse {
				return apierrors.NewConflict(corev1.Resource("nodes"), obj.GetName(), fmt.Errorf("changed"))
			}
			return c.Patch(ctx, obj, patch, opts...)
		}})
	r := New(c, c, "loom-system")
	pass := func() ([]string, bool) {
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(node), n); err != nil {
			t.Fatal(err)
		}
		return r.writeAll(ctx, cp, desired(cp, "loom-system", cluster{nodes: []corev1.Node{*n}}), []corev1.Node{*n}, []string{old.Name})
	}
	unwritten := func(when string) {
		t.Helper()
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(old), ds); err != nil || ds.Spec.Template.Spec.Affinity != nil {
			t.Errorf("%s: the driver DaemonSet was written or removed (%v)", when, err)
		}
	}
	errs, retry := pass()
	unwritten("the node's label refused")
	if !retry || len(errs) != 0 {
		t.Errorf("a refused node label: retry %v, errors %q", retry, errs)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "loom-system", Name: "loom-device-plugin"}, &appsv1.DaemonSet{}); err != nil {
		t.Errorf("the device plugin was not written: %v", err)
	}
	refuse = false
	errs, retry = pass()
	unwritten("the node labelled in the same pass")
	if !retry || len(errs) != 0 {
		t.Errorf("labelling pass: retry %v, errors %q", retry, errs)
	}
	if errs, retry = pass(); retry || len(errs) != 0 {
		t.Errorf("pass after the label: retry %v, errors %q", retry, errs)
	}
	ds := &appsv1.DaemonSet{}
	n := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(node), n); err != nil || n.Labels[gpuv1alpha1.LabelDriverTarget] != "ubuntu22.04" {
		t.Errorf("node labels %v (%v)", n.Labels, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(old), ds); err != nil || !daemonplace.Matches(&ds.Spec.Template.Spec, n) {
		t.Errorf("the driver DaemonSet, written after its node's label, does not place it (%v)", err)
	}
}
