package clusterpolicy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
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
