package clusterpolicy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

const ns = "loom-system"

var defaultOn = []string{"driver", "container-toolkit", "operator-validator", "device-plugin", "dcgm-exporter", "mig-manager"}

func getDS(name string) (*appsv1.DaemonSet, error) {
	if name == "driver" {
		name = "driver-ubuntu22.04" // both GPU nodes run Ubuntu 22.04
	}
	ds := &appsv1.DaemonSet{}
	return ds, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "loom-" + name}, ds)
}

func getPolicy(t *testing.T, name string) *gpuv1alpha1.ClusterPolicy {
	t.Helper()
	cp := &gpuv1alpha1.ClusterPolicy{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, cp); err != nil {
		t.Fatal(err)
	}
	return cp
}

// markRolledOut plays the DaemonSet controller (envtest has none): every
// operand DaemonSet runs ready on n nodes.
func markRolledOut(t *testing.T, n int32) {
	t.Helper()
	list := &appsv1.DaemonSetList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		ds := &list.Items[i]
		patch := client.MergeFrom(ds.DeepCopy())
		ds.Status = appsv1.DaemonSetStatus{DesiredNumberScheduled: n, CurrentNumberScheduled: n, NumberReady: n,
			UpdatedNumberScheduled: n, NumberAvailable: n, ObservedGeneration: ds.Generation}
		if err := env.Client.Status().Patch(context.Background(), ds, patch); err != nil {
			t.Fatal(err)
		}
	}
}

func TestClusterPolicyReconciler(t *testing.T) {
	ctx := context.Background()
	reg := &manager.Registry{}
	reg.Add("clusterpolicy", Setup)
	opts := testenv.ManagerOptions(t)
	opts.LeaderElect = false
	opts.Namespace = ns
	m := env.StartManager(t, opts, reg)
	gpu := map[string]string{gpuv1alpha1.LabelPresent: "true"}
	// One GPU node's OS known by NFD's labels, the other's by its osImage.
	nfd := map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelOSReleaseID: "ubuntu", gpuv1alpha1.LabelOSReleaseVersionID: "22.04"}
	for name, labels := range map[string]map[string]string{"cp-gpu-0": nfd, "cp-gpu-1": gpu, "cp-cpu": nil} {
		if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}); err != nil {
			t.Fatal(err)
		}
	}
	setOSImage(t, "cp-gpu-1", "Ubuntu 22.04.4 LTS")

	if err := env.Client.Create(ctx, policy(t, "default", "{}")); err != nil {
		t.Fatal(err)
	}
	testDefaultStack(t)
	testDeployLabels(t)
	testReadyAndIdle(t)
	testRestartWritesNothing(t, m)
	testSelfRepair(t)
	testTimeSlicing(t)
	testNamedConfigMaps(t)
	testDriverPerOS(t)
	testDisabling(t)
	testSecondPolicy(t)
	testTakeover(t)
}

// spec: {} gives the default stack with narrow RBAC and the RuntimeClass.
func testDefaultStack(t *testing.T) {
	ctx := context.Background()
	// spec: {} gives the default stack, owned by the policy.
	testenv.Eventually(t, 20*time.Second, func() error {
		for _, op := range defaultOn {
			ds, err := getDS(op)
			if err != nil {
				return err
			}
			if len(ds.OwnerReferences) != 1 || ds.OwnerReferences[0].Name != "default" {
				return fmt.Errorf("%s owners %+v", op, ds.OwnerReferences)
			}
			sa := &corev1.ServiceAccount{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "loom-" + op}, sa); err != nil {
				return err
			}
		}
		return nil
	})
	// Operands that talk to the API get their own, narrow RBAC.
	testenv.Eventually(t, 20*time.Second, func() error {
		crb := &rbacv1.ClusterRoleBinding{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: ns + "-loom-driver"}, crb); err != nil {
			return err
		}
		if len(crb.Subjects) != 1 || crb.Subjects[0].Name != "loom-driver" || crb.Subjects[0].Namespace != ns || crb.RoleRef.Name != ns+"-loom-driver" {
			return fmt.Errorf("driver ClusterRoleBinding %+v", crb)
		}
		cr := &rbacv1.ClusterRole{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: ns + "-loom-driver"}, cr); err != nil {
			return err
		}
		if !strings.Contains(fmt.Sprint(cr.Rules), "pods/eviction") {
			return fmt.Errorf("driver ClusterRole rules %v", cr.Rules)
		}
		role := &rbacv1.Role{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "loom-mig-manager"}, role); err != nil {
			return err
		}
		return nil
	})
	for _, none := range []string{"loom-container-toolkit", "loom-dcgm-exporter"} {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: ns + "-" + none}, &rbacv1.ClusterRole{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s has a ClusterRole it needs none of (%v)", none, err)
		}
	}
	rc := &nodev1.RuntimeClass{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: RuntimeClassName}, rc); err != nil || rc.Handler != "nvidia" {
		t.Errorf("RuntimeClass nvidia: %v %+v", err, rc)
	}
	for _, off := range []string{"dcgm", "node-status-exporter"} {
		if _, err := getDS(off); !apierrors.IsNotFound(err) {
			t.Errorf("%s DaemonSet exists though disabled by default (%v)", off, err)
		}
	}
	driver, _ := getDS("driver")
	if driver.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("driver update strategy %s, want OnDelete", driver.Spec.UpdateStrategy.Type)
	}
	exprs := driver.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions
	if fmt.Sprint(exprs) == "" || !strings.Contains(fmt.Sprint(exprs), "nvidia.com/gpu.deploy.driver") || !strings.Contains(fmt.Sprint(exprs), gpuv1alpha1.LabelPresent) {
		t.Errorf("driver affinity %v", exprs)
	}

}

// The policy goes Ready once the pods are, and an idle policy writes nothing.
func testReadyAndIdle(t *testing.T) {
	// Before the pods run: not ready, saying which components wait.
	testenv.Eventually(t, 20*time.Second, func() error {
		cp := getPolicy(t, "default")
		c := meta.FindStatusCondition(cp.Status.Conditions, "Ready")
		if cp.Status.State != gpuv1alpha1.PolicyNotReady || cp.Status.GPUNodes != 2 || len(cp.Status.Components) != 8 || c == nil || c.Reason != ReasonComponentsWait {
			return fmt.Errorf("status %+v", cp.Status)
		}
		return nil
	})
	markRolledOut(t, 2)
	testenv.Eventually(t, 20*time.Second, func() error {
		cp := getPolicy(t, "default")
		if cp.Status.State != gpuv1alpha1.PolicyReady {
			return fmt.Errorf("state %s: %+v", cp.Status.State, cp.Status.Conditions)
		}
		for _, c := range cp.Status.Components {
			if c.Enabled && (c.State != "ready" || c.Desired != 2 || c.Ready != 2 || c.Version == "") {
				return fmt.Errorf("component %+v", c)
			}
		}
		return nil
	})

	// Steady state: nothing is written.
	before := resourceVersions(t)
	time.Sleep(2 * time.Second)
	if after := resourceVersions(t); after != before {
		t.Errorf("idle policy wrote:\n%s\n%s", before, after)
	}

}

// A restart (or a leader change) with nothing changed writes nothing: a
// reconciler with a fresh writer, reading the manager's cache, finds every
// child as it was applied, whatever the server defaulted.
func testRestartWritesNothing(t *testing.T, m *testenv.Manager) {
	ctx := context.Background()
	kinds := []string{"DaemonSet", "ServiceAccount", "ConfigMap", "RuntimeClass", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
	writes := func() (n float64) {
		for _, k := range kinds {
			n += testenv.WritesCounted(t, k, FieldOwner, "apply", "written") + testenv.WritesCounted(t, k, FieldOwner, "create", "written")
		}
		return n + testenv.WritesCounted(t, "ClusterPolicy", FieldOwner, "status", "written")
	}
	before, versions := writes(), resourceVersions(t)
	req := ctrl.Request{NamespacedName: types.NamespacedName{Name: "default"}}
	if _, err := New(m.GetClient(), m.GetAPIReader(), ns).Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if after := writes(); after != before {
		t.Errorf("a restarted reconciler wrote %v times with nothing changed", after-before)
	}
	if after := resourceVersions(t); after != versions {
		t.Errorf("a restarted reconciler wrote:\n%s\n%s", versions, after)
	}
}

// A deleted DaemonSet comes back, a hand edit is reverted.
func testSelfRepair(t *testing.T) {
	ctx := context.Background()
	// Self-repair: a deleted DaemonSet comes back, a hand edit is reverted.
	dp, _ := getDS("device-plugin")
	if err := env.Client.Delete(ctx, dp); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		got, err := getDS("device-plugin")
		if err != nil {
			return err
		}
		if got.UID == dp.UID {
			return fmt.Errorf("not re-created yet")
		}
		return nil
	})
	tk, _ := getDS("container-toolkit")
	want := tk.Spec.Template.Spec.Containers[0].Image
	if err := env.Client.Patch(ctx, tk, client.RawPatch(types.StrategicMergePatchType,
		[]byte(`{"spec":{"template":{"spec":{"containers":[{"name":"container-toolkit","image":"evil/toolkit:latest"}]}}}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		got, _ := getDS("container-toolkit")
		if img := got.Spec.Template.Spec.Containers[0].Image; img != want {
			return fmt.Errorf("image %s, want %s", img, want)
		}
		return nil
	})

}

// A time-slicing change rolls exactly the device plugin.
func testTimeSlicing(t *testing.T) {
	ctx := context.Background()
	// A time-slicing change rolls exactly the device plugin.
	dp, _ := getDS("device-plugin")
	tk, _ := getDS("container-toolkit")
	hash := dp.Spec.Template.Annotations[gpuv1alpha1.AnnotationConfigHash]
	cp := getPolicy(t, "default")
	patch := client.MergeFrom(cp.DeepCopy())
	cp.Spec.DevicePlugin.Config = &gpuv1alpha1.DevicePluginConfig{TimeSlicing: &gpuv1alpha1.TimeSlicingSpec{
		Resources: []gpuv1alpha1.TimeSlicingResource{{Name: "nvidia.com/gpu", Replicas: 4}}}}
	if err := env.Client.Patch(ctx, cp, patch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		got, _ := getDS("device-plugin")
		if got.Spec.Template.Annotations[gpuv1alpha1.AnnotationConfigHash] == hash {
			return fmt.Errorf("device plugin config hash unchanged")
		}
		return nil
	})
	testenv.Eventually(t, 20*time.Second, func() error {
		cm := &corev1.ConfigMap{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "loom-device-plugin-config"}, cm); err != nil {
			return err
		}
		if !strings.Contains(cm.Data["config.yaml"], "replicas: 4") || !strings.Contains(cm.Data["config.yaml"], "name: nvidia.com/gpu") {
			return fmt.Errorf("device plugin config %q", cm.Data["config.yaml"])
		}
		return nil
	})
	if got, _ := getDS("container-toolkit"); got.Generation != tk.Generation {
		t.Errorf("toolkit DaemonSet changed (generation %d -> %d) on a device plugin config change", tk.Generation, got.Generation)
	}

}

// Disabling an operand removes its objects.
func testDisabling(t *testing.T) {
	ctx := context.Background()
	// Disabling an operand removes its objects.
	cp := getPolicy(t, "default")
	patch := client.MergeFrom(cp.DeepCopy())
	cp.Spec.DCGMExporter.Enabled = new(bool)
	cp.Spec.MIGManager.Enabled = new(bool)
	if err := env.Client.Patch(ctx, cp, patch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if _, err := getDS("dcgm-exporter"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("dcgm-exporter DaemonSet still there (%v)", err)
		}
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "loom-dcgm-exporter"}, &corev1.ServiceAccount{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("dcgm-exporter ServiceAccount still there (%v)", err)
		}
		for _, o := range []client.Object{&rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{}} {
			if err := env.Client.Get(ctx, client.ObjectKey{Name: ns + "-loom-mig-manager"}, o); !apierrors.IsNotFound(err) {
				return fmt.Errorf("mig-manager %T still there (%v)", o, err)
			}
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "loom-mig-manager"}, &rbacv1.Role{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("mig-manager Role still there (%v)", err)
		}
		return nil
	})

}

// A second policy is persisted as ignored; the active one is unaffected.
func testSecondPolicy(t *testing.T) {
	ctx := context.Background()
	// A second policy is persisted as ignored, naming the active one.
	time.Sleep(1100 * time.Millisecond) // creation timestamps have second precision
	if err := env.Client.Create(ctx, policy(t, "second", "{}")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		cp := getPolicy(t, "second")
		c := meta.FindStatusCondition(cp.Status.Conditions, "Ready")
		if cp.Status.State != gpuv1alpha1.PolicyIgnored || cp.Status.ActivePolicy != "default" || c == nil || c.Reason != ReasonIgnored {
			return fmt.Errorf("second policy status %+v", cp.Status)
		}
		return nil
	})
	// The active one is unaffected: ready again once its pods are.
	markRolledOut(t, 2)
	testenv.Eventually(t, 20*time.Second, func() error {
		if st := getPolicy(t, "default").Status; st.State != gpuv1alpha1.PolicyReady || st.ActivePolicy != "" {
			return fmt.Errorf("active policy status %+v", st)
		}
		return nil
	})
}

func resourceVersions(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	list := &appsv1.DaemonSetList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, ds := range list.Items {
		fmt.Fprintf(&b, "%s=%s ", ds.Name, ds.ResourceVersion)
	}
	fmt.Fprintf(&b, "policy=%s", getPolicy(t, "default").ResourceVersion)
	return b.String()
}

// Deleting the policy in force hands over to the next oldest at once, with
// no other event: the ignored one must not go on naming a deleted policy.
func testTakeover(t *testing.T) {
	ctx := context.Background()
	if err := env.Client.Delete(ctx, getPolicy(t, "default")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		st := getPolicy(t, "second").Status
		if st.State == gpuv1alpha1.PolicyIgnored || st.ActivePolicy != "" {
			return fmt.Errorf("second policy still ignored after the one in force went: %+v", st)
		}
		return nil
	})
}
