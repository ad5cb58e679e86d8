package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	rayutils "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/testenv"
)

// After `helm uninstall --no-hooks`, kubectl loom uninstall-cleanup
// removes what Loom left (GPUNodes, its node labels, annotations and
// taint, its RuntimeClass, the RayJobs' stop-job finalizer), with no more
// rights than the chart gives its own cleanup hook.
func TestUninstallCleanupCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	own, err := testenv.StartWithout(ctx, "training.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = own.Stop() }()
	c := own.Client
	for _, ns := range []string{"loom-system", "ml"} {
		if err := own.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := testenv.RenderChart("loom-system", "uninstall.cleanup=true")
	if err != nil {
		t.Fatal(err)
	}
	objs = slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool {
		return o.GetName() != "loom-uninstall-cleanup" || !strings.HasPrefix(o.GetAPIVersion(), "rbac.authorization.k8s.io/")
	})
	if len(objs) != 4 {
		t.Fatalf("the chart rendered %d of the cleanup hook's roles and bindings, want 4", len(objs))
	}
	create := func(obj client.Object) {
		t.Helper()
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	if err := testenv.Apply(ctx, own.Config, c, objs); err != nil {
		t.Fatal(err)
	}
	create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{"team": "ml"},
		Annotations: map[string]string{gpuv1alpha1.AnnotationUnhealthyTaint: "xid-79"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: gpuv1alpha1.TaintUnhealthy, Value: "xid-79", Effect: corev1.TaintEffectNoSchedule}}}})
	labels := &unstructured.Unstructured{}
	labels.SetAPIVersion("v1")
	labels.SetKind("Node")
	labels.SetName("gpu-1")
	labels.SetLabels(map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3"})
	labels.SetAnnotations(map[string]string{gpuv1alpha1.AnnotationManagedLabels: gpuv1alpha1.LabelPresent + "," + gpuv1alpha1.LabelProduct})
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(labels), client.FieldOwner(gpuv1alpha1.FieldOwnerGPULabels), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	create(&gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	create(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia", Labels: map[string]string{apply.LabelManagedBy: apply.ManagedBy}}, Handler: "nvidia"})
	create(&rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "job", Finalizers: []string{rayutils.RayJobStopJobFinalizer}},
		Spec: rayv1.RayJobSpec{Entrypoint: "python train.py"}})

	create(loomWorkload(&appsv1.Deployment{}, "loom-system", "loom", "manager", "loom-manager", "loom-manager"))

	kc := kubeconfigFor(t, own.Config)
	if _, err := runAsOn(t, kc, "nobody", "uninstall-cleanup", "--timeout=10s"); err == nil || !strings.Contains(err.Error(), "name Loom's namespace with -n") {
		t.Errorf("without -n: %v", err)
	}
	_, err = runAsOn(t, kc, "nobody", "uninstall-cleanup", "-n", "loom-system", "--timeout=10s")
	if err == nil || !strings.Contains(err.Error(), "kubectl loom uninstall-cleanup needs ") {
		t.Errorf("as a user without rights: %v", err)
	}
	out, err := runAsOn(t, kc, "system:serviceaccount:loom-system:loom-uninstall-cleanup", "uninstall-cleanup", "-n", "loom-system",
		"--rayjob-finalizers", "--timeout=10s")
	if err != nil {
		t.Fatalf("uninstall-cleanup as the chart's hook: %v\n%s", err, out)
	}
	for _, want := range []string{`found Loom's release "loom" in namespace loom-system: manager Deployment loom-manager, leader Lease loom-manager`,
		"deleted Deployment loom-system/loom-manager", "deleted 1 GPUNodes", "deleted RuntimeClass nvidia", "removed Loom's labels from node gpu-1",
		"removed Loom's taint from node gpu-1", "removed the stop-job finalizer of RayJob ml/job"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	n := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: "gpu-1"}, n); err != nil {
		t.Fatal(err)
	}
	unhealthy := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gpuv1alpha1.TaintUnhealthy })
	if len(n.Labels) != 1 || n.Labels["team"] != "ml" || unhealthy || len(n.Annotations) != 0 {
		t.Errorf("node left with labels %v annotations %v taints %v, want only the user's label", n.Labels, n.Annotations, n.Spec.Taints)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "gpu-1"}, &gpuv1alpha1.GPUNode{}); !apierrors.IsNotFound(err) {
		t.Errorf("GPUNode left (%v)", err)
	}
	job := &rayv1.RayJob{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: "job"}, job); err != nil || len(job.Finalizers) != 0 {
		t.Errorf("RayJob finalizers %v (%v)", job.Finalizers, err)
	}
}

// loomWorkload makes obj (a Deployment or a DaemonSet) the chart's
// component of release in namespace, named name, its pods started with
// --leader-election-id=lease.
func loomWorkload[T interface {
	*appsv1.Deployment | *appsv1.DaemonSet
	client.Object
}](obj T, namespace, release, component, name, lease string) T {
	obj.SetNamespace(namespace)
	obj.SetName(name)
	obj.SetLabels(map[string]string{"app.kubernetes.io/part-of": "loom", "app.kubernetes.io/instance": release, "app.kubernetes.io/component": component})
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel.MatchLabels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "loom", Args: []string{"manager", "--leader-election-id=" + lease}}}}}
	switch o := any(obj).(type) {
	case *appsv1.Deployment:
		o.Spec = appsv1.DeploymentSpec{Selector: sel, Template: tmpl}
	case *appsv1.DaemonSet:
		o.Spec = appsv1.DaemonSetSpec{Selector: sel, Template: tmpl}
	}
	return obj
}

// With -n alone, uninstall-cleanup finds the release in the namespace
// whatever it is named (its manager Deployment's labels), its node agent
// and its leader Lease, instead of assuming a release named loom; it names
// the releases when there are several and stops, and says when there is
// none, and refuses when none is where -n and --release say while Loom
// runs elsewhere.
func TestUninstallCleanupFindsTheRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	own, err := testenv.StartWithout(ctx, "training.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = own.Stop() }()
	c := own.Client
	for _, ns := range []string{"tenant", "empty"} {
		if err := own.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	for _, obj := range []client.Object{
		loomWorkload(&appsv1.Deployment{}, "tenant", "gpu", "manager", "gpu-manager", "gpu-lease"),
		loomWorkload(&appsv1.DaemonSet{}, "tenant", "gpu", "node-agent", "gpu-node-agent", ""),
		loomWorkload(&appsv1.Deployment{}, "tenant", "other", "manager", "other-loom-manager", "other-lease"),
		loomWorkload(&appsv1.DaemonSet{}, "tenant", "other", "node-agent", "other-loom-node-agent", ""),
		// The default's Lease, held: the cleanup would wait on it.
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "loom-manager"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("m1"), LeaseDurationSeconds: ptr.To[int32](600), RenewTime: &metav1.MicroTime{Time: time.Now()}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	kc := kubeconfigFor(t, own.Config)
	_, err = runAsOn(t, kc, "", "uninstall-cleanup", "-n", "tenant", "--timeout=5s")
	if err == nil || !strings.Contains(err.Error(), "namespace tenant holds 2 Loom releases: gpu (Deployment gpu-manager), other (Deployment other-loom-manager); name one with --release") {
		t.Errorf("with two releases: %v", err)
	}
	out, err := runAsOn(t, kc, "", "uninstall-cleanup", "-n", "tenant", "--release", "gpu", "--timeout=5s")
	if err != nil {
		t.Fatalf("--release gpu: %v\n%s", err, out)
	}
	for _, want := range []string{`found Loom's release "gpu" in namespace tenant: manager Deployment gpu-manager, leader Lease gpu-lease`,
		"deleted Deployment tenant/gpu-manager", "deleted DaemonSet tenant/gpu-node-agent"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, name := range []string{"other-loom-manager", "other-loom-node-agent"} {
		var obj client.Object = &appsv1.Deployment{}
		if strings.HasSuffix(name, "agent") {
			obj = &appsv1.DaemonSet{}
		}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "tenant", Name: name}, obj); err != nil {
			t.Errorf("the other release's %s: %v", name, err)
		}
	}
	// A namespace or release mistyped, while Loom runs elsewhere, is
	// refused before anything is deleted: the ClusterPolicy stays.
	if err := c.Create(ctx, &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"-n", "empty"}, {"-n", "tenant", "--release", "gpx"}} {
		_, err = runAsOn(t, kc, "", append([]string{"uninstall-cleanup", "--timeout=5s"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "but Loom's manager runs as release other in namespace tenant (Deployment other-loom-manager): "+
			"the cleanup would delete every ClusterPolicy and GPUNode it serves") {
			t.Errorf("%v while another release runs: %v", args, err)
		}
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "default"}, &gpuv1alpha1.ClusterPolicy{}); err != nil {
		t.Errorf("the ClusterPolicy, after the refusals: %v", err)
	}
	if err := c.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "other-loom-manager"}}); err != nil {
		t.Fatal(err)
	}
	out, err = runAsOn(t, kc, "", "uninstall-cleanup", "-n", "empty", "--timeout=5s")
	if err != nil || !strings.Contains(out, "no Loom manager Deployment in namespace empty") {
		t.Errorf("without a release: %v\n%s", err, out)
	}
}
