package clusterpolicy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/testenv"
)

func setOSImage(t *testing.T, node, osImage string) {
	t.Helper()
	n := &corev1.Node{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Status.NodeInfo.OSImage = osImage
	if err := env.Client.Status().Patch(context.Background(), n, patch); err != nil {
		t.Fatal(err)
	}
}

func configHash(t *testing.T, op string) string {
	t.Helper()
	ds, err := getDS(op)
	if err != nil {
		t.Fatal(err)
	}
	return ds.Spec.Template.Annotations[gpuv1alpha1.AnnotationConfigHash]
}

func component(cp *gpuv1alpha1.ClusterPolicy, name string) gpuv1alpha1.ComponentStatus {
	if i := findComponent(cp.Status.Components, name); i >= 0 {
		return cp.Status.Components[i]
	}
	return gpuv1alpha1.ComponentStatus{}
}

// A user ConfigMap the policy names: missing, the operand is not rolled
// out and its component names it; its content edited, the operand rolls;
// an unrelated ConfigMap edited, nothing is written.
func testNamedConfigMaps(t *testing.T) {
	ctx := context.Background()
	before := configHash(t, "device-plugin")
	cp := getPolicy(t, "default")
	patch := client.MergeFrom(cp.DeepCopy())
	cp.Spec.DevicePlugin.Config = &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "sharing", DefaultConfig: "any"}
	if err := env.Client.Patch(ctx, cp, patch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if c := component(getPolicy(t, "default"), "device-plugin"); !strings.Contains(c.Message, "ConfigMap loom-system/sharing (devicePlugin.config.configMapName) not found") {
			return fmt.Errorf("device plugin component %+v", c)
		}
		return nil
	})
	if got := configHash(t, "device-plugin"); got != before {
		t.Errorf("device plugin rolled out (%s -> %s) before its ConfigMap exists", before, got)
	}

	sharing := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sharing"},
		Data: map[string]string{"any": "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n"}}
	unrelated := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unrelated"}, Data: map[string]string{"a": "1"}}
	for _, cm := range []*corev1.ConfigMap{sharing, unrelated} {
		if err := env.Client.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	var first string
	testenv.Eventually(t, 20*time.Second, func() error {
		ds, _ := getDS("device-plugin")
		if first = ds.Spec.Template.Annotations[gpuv1alpha1.AnnotationConfigHash]; first == before || len(ds.Spec.Template.Spec.Containers) != 2 {
			return fmt.Errorf("device plugin not rolled out with the config manager: %d containers", len(ds.Spec.Template.Spec.Containers))
		}
		return nil
	})
	markRolledOut(t, 2)

	patch = client.MergeFrom(sharing.DeepCopy())
	sharing.Data["any"] = strings.Replace(sharing.Data["any"], "replicas: 2", "replicas: 4", 1)
	if err := env.Client.Patch(ctx, sharing, patch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if got := configHash(t, "device-plugin"); got == first {
			return fmt.Errorf("device plugin config hash unchanged after its ConfigMap's edit")
		}
		return nil
	})
	markRolledOut(t, 2)
	testenv.Eventually(t, 20*time.Second, func() error {
		if cp := getPolicy(t, "default"); cp.Status.State != gpuv1alpha1.PolicyReady {
			return fmt.Errorf("state %s: %+v", cp.Status.State, cp.Status.Conditions)
		}
		return nil
	})

	idle := resourceVersions(t)
	patch = client.MergeFrom(unrelated.DeepCopy())
	unrelated.Data["a"] = "2"
	if err := env.Client.Patch(ctx, unrelated, patch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if after := resourceVersions(t); after != idle {
		t.Errorf("an unrelated ConfigMap's edit wrote:\n%s\n%s", idle, after)
	}

	cp = getPolicy(t, "default")
	patch = client.MergeFrom(cp.DeepCopy())
	cp.Spec.DevicePlugin.Config = nil
	if err := env.Client.Patch(ctx, cp, patch); err != nil {
		t.Fatal(err)
	}
}

// A GPU node of another OS gets a driver DaemonSet of its own, placing the
// nodes labelled with its target, removed with the node; one of an unknown
// OS is named in the driver component, and has no target label. Nodes
// coming and going write no other OS's DaemonSet.
func testDriverPerOS(t *testing.T) {
	ctx := context.Background()
	ubuntu, err := getDS("driver-ubuntu22.04")
	if err != nil {
		t.Fatal(err)
	}
	rhel := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-gpu-rhel", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}}}
	rhel2 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-gpu-rhel-2", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}}}
	bare := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-gpu-bare", Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}}}
	for _, n := range []*corev1.Node{rhel, rhel2, bare} {
		if err := env.Client.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	setOSImage(t, rhel.Name, "Red Hat Enterprise Linux 9.4 (Plow)")
	setOSImage(t, rhel2.Name, "Red Hat Enterprise Linux 9.4 (Plow)")
	testenv.Eventually(t, 20*time.Second, func() error {
		ds, err := getDS("driver-rhel9.4")
		if err != nil {
			return err
		}
		if img := ds.Spec.Template.Spec.Containers[0].Image; img != "nvcr.io/nvidia/driver:570.172.08-rhel9.4" {
			return fmt.Errorf("image %s", img)
		}
		if terms := ds.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; len(terms) != 1 ||
			!strings.Contains(fmt.Sprint(terms), gpuv1alpha1.LabelDriverTarget) {
			return fmt.Errorf("node terms %+v, want one, on the driver-target label", terms)
		}
		for name, want := range map[string]string{rhel.Name: "rhel9.4", rhel2.Name: "rhel9.4", bare.Name: "", "cp-gpu-1": "ubuntu22.04"} {
			n := &corev1.Node{}
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
				return err
			}
			if got := n.Labels[gpuv1alpha1.LabelDriverTarget]; got != want {
				return fmt.Errorf("node %s: driver target %q, want %q", name, got, want)
			}
		}
		if !metav1.IsControlledBy(ds, getPolicy(t, "default")) || ds.Spec.Template.Annotations[gpuv1alpha1.AnnotationTemplateHash] == "" {
			return fmt.Errorf("owners %v, annotations %v", ds.OwnerReferences, ds.Spec.Template.Annotations)
		}
		if c := component(getPolicy(t, "default"), "driver"); !strings.Contains(c.Message, "1 GPU nodes get no driver: cp-gpu-bare (OS unknown)") {
			return fmt.Errorf("driver component %+v", c)
		}
		return nil
	})
	for _, n := range []*corev1.Node{rhel, rhel2, bare} {
		if err := env.Client.Delete(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		ds, err := getDS("driver-rhel9.4")
		if err == nil && ds.DeletionTimestamp == nil {
			return fmt.Errorf("driver DaemonSet of rhel9.4 still there")
		}
		return nil
	})
	if got, _ := getDS("driver-ubuntu22.04"); got.Generation != ubuntu.Generation || got.ResourceVersion != ubuntu.ResourceVersion {
		t.Errorf("the Ubuntu driver DaemonSet changed (generation %d -> %d)", ubuntu.Generation, got.Generation)
	}
}
