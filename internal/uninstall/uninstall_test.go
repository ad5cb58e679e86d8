package uninstall

import (
	"bytes"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/testenv"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// cleanupFixture is what an installed Loom leaves on a cluster: a policy,
// a node claimed by its driver upgrade with the labeller's labels and
// taint next to a user's label and taint, a GPUNode, the manager (holding
// its lease) and the node agent.
func cleanupFixture(t *testing.T, ctx context.Context, c client.Client) {
	t.Helper()
	must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "loom-system"}}))
	must(t, c.Create(ctx, &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1",
		Labels: map[string]string{"nvidia.com/gpu.deploy.driver": "false", gpuv1alpha1.LabelDriverTarget: "ubuntu22.04",
			"nvidia.com/gpu.deploy.dcgm": "true"}, // a person's true
		Annotations: map[string]string{gpuv1alpha1.AnnotationClaim: "default", gpuv1alpha1.AnnotationUnhealthyTaint: "xid-79"}},
		Spec: corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{
			{Key: gpuv1alpha1.TaintUnhealthy, Value: "xid-79", Effect: corev1.TaintEffectNoSchedule},
			{Key: gpuv1alpha1.TaintUnhealthy, Value: "ops", Effect: corev1.TaintEffectNoExecute},
			{Key: "team", Value: "ml", Effect: corev1.TaintEffectNoSchedule}}}}
	must(t, c.Create(ctx, node, client.FieldOwner("kubectl")))
	labels := &unstructured.Unstructured{}
	labels.SetAPIVersion("v1")
	labels.SetKind("Node")
	labels.SetName("gpu-1")
	labels.SetLabels(map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3"})
	labels.SetAnnotations(map[string]string{gpuv1alpha1.AnnotationManagedLabels: gpuv1alpha1.LabelPresent + "," + gpuv1alpha1.LabelProduct})
	must(t, c.Apply(ctx, client.ApplyConfigurationFromUnstructured(labels), client.FieldOwner(gpuv1alpha1.FieldOwnerGPULabels), client.ForceOwnership))
	// The deploy labels the ClusterPolicy set where they were missing, as
	// its controller writes them; the driver manager has since paused one.
	policyLabels := []byte(`{"metadata":{"labels":{"nvidia.com/gpu.deploy.device-plugin":"true","nvidia.com/gpu.deploy.dcgm-exporter":"true"}}}`)
	must(t, c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}, client.RawPatch(types.MergePatchType, policyLabels),
		client.FieldOwner(gpuv1alpha1.FieldOwnerClusterPolicy)))
	paused := []byte(`{"metadata":{"labels":{"nvidia.com/gpu.deploy.dcgm-exporter":"paused-for-driver-upgrade"}}}`)
	must(t, c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}, client.RawPatch(types.MergePatchType, paused),
		client.FieldOwner("k8s-driver-manager")))
	must(t, c.Create(ctx, &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}))
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel.MatchLabels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "loom"}}}}
	must(t, c.Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-manager"},
		Spec: appsv1.DeploymentSpec{Selector: sel, Template: tmpl}}))
	must(t, c.Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-node-agent"},
		Spec: appsv1.DaemonSetSpec{Selector: sel, Template: tmpl}}))
	must(t, c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-manager"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("m1"), LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &metav1.MicroTime{Time: time.Now()}}}))
}

// fakeManager plays the running manager: it releases the node its driver
// upgrade claimed once the policy is gone (unless release is false: its
// driver upgrade does not run), and gives its lease up once its Deployment
// is deleted.
func fakeManager(ctx context.Context, c client.Client, release bool) {
	released, stopped := !release, false
	for ctx.Err() == nil && (!released || !stopped) {
		time.Sleep(50 * time.Millisecond)
		if err := c.Get(ctx, client.ObjectKey{Name: "default"}, &gpuv1alpha1.ClusterPolicy{}); !released && apierrors.IsNotFound(err) {
			n := &corev1.Node{}
			if c.Get(ctx, client.ObjectKey{Name: "gpu-1"}, n) == nil {
				base := n.DeepCopy()
				delete(n.Annotations, gpuv1alpha1.AnnotationClaim)
				n.Spec.Unschedulable = false
				released = c.Patch(ctx, n, client.MergeFrom(base)) == nil
			}
		}
		err := c.Get(ctx, client.ObjectKey{Namespace: "loom-system", Name: "loom-manager"}, &appsv1.Deployment{})
		if !stopped && apierrors.IsNotFound(err) {
			l := &coordinationv1.Lease{}
			if c.Get(ctx, client.ObjectKey{Namespace: "loom-system", Name: "loom-manager"}, l) == nil {
				l.Spec.HolderIdentity = nil
				stopped = c.Update(ctx, l) == nil
			}
		}
	}
}

func TestUninstallCleanup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := testenv.StartWithout(ctx, "training.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	c := env.Client
	cleanupFixture(t, ctx, c)
	// RayJobs Loom's rayjob controller gave KubeRay's stop-job finalizer:
	// one beside another party's finalizer, one already being deleted.
	must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}))
	for name, finalizers := range map[string][]string{"kept": {rayutils.RayJobStopJobFinalizer, "example.com/keep"}, "deleted": {rayutils.RayJobStopJobFinalizer}} {
		job := &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, Finalizers: finalizers}, Spec: rayv1.RayJobSpec{Entrypoint: "python train.py"}}
		must(t, c.Create(ctx, job))
	}
	must(t, c.Delete(ctx, &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "deleted"}}))
	go fakeManager(ctx, c, true)

	var out bytes.Buffer
	cfg := Config{Namespace: "loom-system", ManagerDeployment: "loom-manager", AgentDaemonSet: "loom-node-agent",
		Lease: "loom-manager", RayJobs: true, Timeout: 30 * time.Second, Poll: 100 * time.Millisecond}
	if err := Run(ctx, c, cfg, &out); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out.String())
	}
	t.Log(out.String())

	n := &corev1.Node{}
	must(t, c.Get(ctx, client.ObjectKey{Name: "gpu-1"}, n))
	for _, k := range []string{gpuv1alpha1.LabelPresent, gpuv1alpha1.LabelProduct, gpuv1alpha1.LabelDriverTarget} {
		if _, ok := n.Labels[k]; ok {
			t.Errorf("Loom's label %s left on the node", k)
		}
	}
	if _, ok := n.Labels["nvidia.com/gpu.deploy.device-plugin"]; ok {
		t.Errorf("the ClusterPolicy's deploy label left on the node: %v", n.Labels)
	}
	if n.Labels["nvidia.com/gpu.deploy.driver"] != "false" || n.Labels["nvidia.com/gpu.deploy.dcgm"] != "true" ||
		n.Labels["nvidia.com/gpu.deploy.dcgm-exporter"] != "paused-for-driver-upgrade" {
		t.Errorf("a label someone else set or changed was removed: %v", n.Labels)
	}
	for _, k := range []string{gpuv1alpha1.AnnotationManagedLabels, gpuv1alpha1.AnnotationUnhealthyTaint, gpuv1alpha1.AnnotationClaim} {
		if _, ok := n.Annotations[k]; ok {
			t.Errorf("annotation %s left on the node", k)
		}
	}
	team, evict := false, false
	for _, taint := range n.Spec.Taints {
		team = team || taint.Key == "team"
		evict = evict || (taint.Key == gpuv1alpha1.TaintUnhealthy && taint.Effect == corev1.TaintEffectNoExecute)
		if gpuv1alpha1.IsUnhealthyTaint(taint) {
			t.Errorf("Loom's taint left: %v", n.Spec.Taints)
		}
	}
	if !team || !evict || n.Spec.Unschedulable {
		t.Errorf("taints %v unschedulable %v, want the user's taints kept (a NoExecute of Loom's key too) and the node uncordoned", n.Spec.Taints, n.Spec.Unschedulable)
	}
	gns := &gpuv1alpha1.GPUNodeList{}
	must(t, c.List(ctx, gns))
	cps := &gpuv1alpha1.ClusterPolicyList{}
	must(t, c.List(ctx, cps))
	if len(gns.Items) != 0 || len(cps.Items) != 0 {
		t.Errorf("%d GPUNodes and %d ClusterPolicies left", len(gns.Items), len(cps.Items))
	}
	kept := &rayv1.RayJob{}
	must(t, c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: "kept"}, kept))
	if len(kept.Finalizers) != 1 || kept.Finalizers[0] != "example.com/keep" {
		t.Errorf("RayJob finalizers %v, want only another party's", kept.Finalizers)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: "deleted"}, &rayv1.RayJob{}); !apierrors.IsNotFound(err) {
		t.Errorf("a deleted RayJob is still there (%v): its stop-job finalizer was left", err)
	}
	for _, obj := range []client.Object{&appsv1.Deployment{}, &appsv1.DaemonSet{}} {
		name := map[bool]string{true: "loom-manager", false: "loom-node-agent"}[func() bool { _, d := obj.(*appsv1.Deployment); return d }()]
		if err := c.Get(ctx, client.ObjectKey{Namespace: "loom-system", Name: name}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%s still there (%v)", name, err)
		}
	}
}

// A manager still leading (its Deployment not the one named, or not
// stopping) may write again what the cleanup removes: the cleanup stops
// before removing anything on the nodes, naming the manager, and says
// which node it waited for.
func TestUninstallCleanupStopsWhileTheManagerLeads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := testenv.StartWithout(ctx, "training.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	cleanupFixture(t, ctx, env.Client)
	var out bytes.Buffer
	cfg := Config{Namespace: "loom-system", Lease: "loom-manager", Timeout: 2 * time.Second, Poll: 100 * time.Millisecond}
	err = Run(ctx, env.Client, cfg, &out)
	if err == nil || !strings.Contains(err.Error(), "the manager m1 still leads") || !strings.Contains(out.String(), "node gpu-1 (claimed by the driver upgrade)") {
		t.Fatalf("cleanup error %v, want one naming the manager, and the claimed node in\n%s", err, out.String())
	}
	n := &corev1.Node{}
	must(t, env.Client.Get(ctx, client.ObjectKey{Name: "gpu-1"}, n))
	if n.Annotations[gpuv1alpha1.AnnotationClaim] != "default" || n.Labels[gpuv1alpha1.LabelPresent] != "true" {
		t.Errorf("the node was changed under a running manager: labels %v, annotations %v", n.Labels, n.Annotations)
	}
}

// A manager that does not release the nodes its driver upgrade claimed
// (its driver upgrade controller off, or crash-looping) does not stop the
// cleanup: once the manager is stopped, the cleanup releases them itself
// as the manager would (Loom's cordon lifted, a cordon that was there
// before kept, the state label and annotations removed), says which node
// got what, finishes the rest and succeeds.
func TestUninstallCleanupReleasesNodesTheManagerDidNot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := testenv.StartWithout(ctx, "training.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	c := env.Client
	cleanupFixture(t, ctx, c)
	// gpu-2 is cordoned by the driver upgrade, mid-validation.
	must(t, c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-2",
		Labels: map[string]string{gpuv1alpha1.LabelUpgradeState: gpuv1alpha1.ValidationRequired, "team": "ml"},
		Annotations: map[string]string{gpuv1alpha1.AnnotationClaim: "default", gpuv1alpha1.AnnotationUpgradeStarted: "2026-03-01T12:00:00Z",
			gpuv1alpha1.AnnotationTarget: "new"}},
		Spec: corev1.NodeSpec{Unschedulable: true}}, client.FieldOwner(gpuv1alpha1.FieldOwnerDriverUpgrade)))
	go fakeManager(ctx, c, false)

	var out bytes.Buffer
	cfg := Config{Namespace: "loom-system", ManagerDeployment: "loom-manager", AgentDaemonSet: "loom-node-agent",
		Lease: "loom-manager", Timeout: 2 * time.Second, Poll: 100 * time.Millisecond}
	if err := Run(ctx, c, cfg, &out); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out.String())
	}
	for _, want := range []string{"released node gpu-2 from the driver upgrade and uncordoned it",
		"released node gpu-1 from the driver upgrade; it stays cordoned", "kubectl uncordon gpu-1", "removed Loom's labels from node gpu-1", "deleted 1 GPUNodes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for name, cordoned := range map[string]bool{"gpu-1": true, "gpu-2": false} {
		n := &corev1.Node{}
		must(t, c.Get(ctx, client.ObjectKey{Name: name}, n))
		if n.Spec.Unschedulable != cordoned {
			t.Errorf("node %s unschedulable %v, want %v", name, n.Spec.Unschedulable, cordoned)
		}
		if _, ok := n.Labels[gpuv1alpha1.LabelUpgradeState]; ok {
			t.Errorf("node %s keeps its upgrade state: %v", name, n.Labels)
		}
		for k := range n.Annotations {
			if strings.HasPrefix(k, "gpu.loom.dev/driver-upgrade-") {
				t.Errorf("node %s keeps annotation %s", name, k)
			}
		}
	}
}

// Loom's CRDs deleted before the uninstall (by hand, or a --skip-crds
// install whose manager never applied them): the hook has no policy or
// GPUNode to remove, still removes the labels and taint Loom set, and does
// not fail helm uninstall.
func TestUninstallCleanupWithoutLoomCRDs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := testenv.StartWithout(ctx, "training.loom.dev", "gpu.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	c := env.Client
	must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "loom-system"}}))
	must(t, c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}))
	labels := &unstructured.Unstructured{}
	labels.SetAPIVersion("v1")
	labels.SetKind("Node")
	labels.SetName("gpu-1")
	labels.SetLabels(map[string]string{gpuv1alpha1.LabelPresent: "true"})
	must(t, c.Apply(ctx, client.ApplyConfigurationFromUnstructured(labels), client.FieldOwner(gpuv1alpha1.FieldOwnerGPULabels), client.ForceOwnership))

	var out bytes.Buffer
	cfg := Config{Namespace: "loom-system", Lease: "loom-manager", RayJobs: true, Timeout: 5 * time.Second, Poll: 100 * time.Millisecond}
	if err := Run(ctx, c, cfg, &out); err != nil {
		t.Fatalf("cleanup without Loom's CRDs: %v\n%s", err, out.String())
	}
	n := &corev1.Node{}
	must(t, c.Get(ctx, client.ObjectKey{Name: "gpu-1"}, n))
	if _, ok := n.Labels[gpuv1alpha1.LabelPresent]; ok {
		t.Errorf("Loom's label left on the node: %v", n.Labels)
	}
}

// After a helm uninstall no manager leads: the cleanup does not wait its
// timeout for a release no one makes, it releases the claimed node at once.
func TestUninstallCleanupWithoutAManagerDoesNotWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := testenv.StartWithout(ctx, "training.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	c := env.Client
	cleanupFixture(t, ctx, c)
	must(t, c.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-manager"}}))
	must(t, c.Delete(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-node-agent"}}))
	must(t, c.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-manager"}}))
	var out bytes.Buffer
	cfg := Config{Namespace: "loom-system", Lease: "loom-manager", Timeout: time.Minute, Poll: 100 * time.Millisecond}
	start := time.Now()
	if err := Run(ctx, c, cfg, &out); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out.String())
	}
	if d := time.Since(start); d > 20*time.Second || !strings.Contains(out.String(), "released node gpu-1 from the driver upgrade") {
		t.Errorf("cleanup took %s:\n%s", d, out.String())
	}
}

// installWorkloadCRD serves a schemaless stand-in for Kueue's Workload kind.
func installWorkloadCRD(t *testing.T, ctx context.Context, env *testenv.Env) {
	t.Helper()
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "workloads." + kueue.Group},
		"spec": map[string]any{"group": kueue.Group, "scope": "Namespaced",
			"names": map[string]any{"plural": "workloads", "singular": "workload", "kind": "Workload", "listKind": "WorkloadList"},
			"versions": []any{map[string]any{"name": kueue.WorkloadGVK.Version, "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}},
	}}
	must(t, testenv.Apply(ctx, env.Config, env.Client, []*unstructured.Unstructured{crd}))
	must(t, testenv.WaitForCRDs(ctx, env.Config, "workloads."+kueue.Group))
}

// The Workloads Loom's trainingjob controller made carry Kueue's
// resource-in-use finalizer, which Kueue removes only from Workloads no
// one owns: the cleanup takes it off every TrainingJob's Workload (one
// being deleted goes), and leaves another owner's Workload and other
// finalizers as they are.
func TestUninstallCleanupFreesTrainingJobWorkloads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := testenv.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	c := env.Client
	installWorkloadCRD(t, ctx, env)
	must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}))
	workload := func(name, ownerAPIVersion, ownerKind string, finalizers ...string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(kueue.WorkloadGVK)
		u.SetNamespace("ml")
		u.SetName(name)
		u.SetFinalizers(finalizers)
		u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: ownerAPIVersion, Kind: ownerKind, Name: name, UID: "u-" + types.UID(name), Controller: ptr.To(true)}})
		must(t, c.Create(ctx, u))
		return u
	}
	const other = "example.com/keep"
	workload("loom-kept", "training.loom.dev/v1alpha1", "TrainingJob", kueue.ResourceInUseFinalizer, other)
	deleted := workload("loom-deleted", "training.loom.dev/v1alpha1", "TrainingJob", kueue.ResourceInUseFinalizer)
	must(t, c.Delete(ctx, deleted))
	workload("batch-job", "batch/v1", "Job", kueue.ResourceInUseFinalizer)

	var out bytes.Buffer
	cfg := Config{Namespace: "loom-system", Lease: "loom-manager", Workloads: true, Timeout: 10 * time.Second, Poll: 100 * time.Millisecond}
	must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "loom-system"}}))
	if err := Run(ctx, c, cfg, &out); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out.String())
	}
	t.Log(out.String())
	finalizers := func(name string) ([]string, error) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(kueue.WorkloadGVK)
		err := c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: name}, u)
		return u.GetFinalizers(), err
	}
	if f, err := finalizers("loom-kept"); err != nil || !slices.Equal(f, []string{other}) {
		t.Errorf("a TrainingJob's Workload has finalizers %v (%v), want only %s", f, err, other)
	}
	if _, err := finalizers("loom-deleted"); !apierrors.IsNotFound(err) {
		t.Errorf("a deleted TrainingJob's Workload is still there (%v): its finalizer was left", err)
	}
	if f, err := finalizers("batch-job"); err != nil || !slices.Equal(f, []string{kueue.ResourceInUseFinalizer}) {
		t.Errorf("a Job's Workload has finalizers %v (%v), want Kueue's kept", f, err)
	}
}

// A manager run without leader election holds no Lease: its pods are what
// tells that it still runs. The cleanup waits for them (and says so at its
// timeout) before it touches the nodes, and goes on once they are gone.
func TestUninstallCleanupWaitsForAManagerWithoutLeaderElection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := testenv.StartWithout(ctx, "training.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	c := env.Client
	cleanupFixture(t, ctx, c)
	must(t, c.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-manager"}}))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: "loom-manager-7c9f-x2x", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "loom"}}}}
	must(t, c.Create(ctx, pod))
	var out bytes.Buffer
	cfg := Config{Namespace: "loom-system", ManagerDeployment: "loom-manager", Lease: "loom-manager", Timeout: 2 * time.Second, Poll: 100 * time.Millisecond}
	err = Run(ctx, c, cfg, &out)
	if err == nil || !strings.Contains(err.Error(), "manager pod "+pod.Name) {
		t.Fatalf("cleanup error %v, want one naming the manager's pod\n%s", err, out.String())
	}
	n := &corev1.Node{}
	must(t, c.Get(ctx, client.ObjectKey{Name: "gpu-1"}, n))
	if n.Annotations[gpuv1alpha1.AnnotationClaim] != "default" || n.Labels[gpuv1alpha1.LabelPresent] != "true" {
		t.Errorf("the node was changed under a running manager: labels %v, annotations %v", n.Labels, n.Annotations)
	}
	// The pod goes (the garbage collector, after the Deployment's delete).
	must(t, c.Delete(ctx, pod, client.GracePeriodSeconds(0)))
	out.Reset()
	if err := Run(ctx, c, cfg, &out); err != nil {
		t.Fatalf("cleanup once the manager's pod is gone: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "released node gpu-1 from the driver upgrade") {
		t.Errorf("the claimed node was not released:\n%s", out.String())
	}
}

// A node agent pod deleted on a node that is not Ready (or is gone) stays
// there, Terminating, until its kubelet is back: the cleanup does not wait
// for it (one dead GPU node would hold every uninstall), names it and
// finishes; a deleted pod on a Ready node is still waited for.
func TestUninstallCleanupDoesNotWaitForPodsOnDeadNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := testenv.StartWithout(ctx, "training.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	c := env.Client
	cleanupFixture(t, ctx, c)
	go fakeManager(ctx, c, true)
	ds := &appsv1.DaemonSet{}
	must(t, c.Get(ctx, client.ObjectKey{Namespace: "loom-system", Name: "loom-node-agent"}, ds))
	agentPod := func(name, node string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "loom-system", Name: name,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "loom"}}}}
		must(t, c.Create(ctx, p))
		// Bound to a node, it is deleted gracefully: it stays until a
		// kubelet confirms.
		must(t, c.Delete(ctx, p))
		return p
	}
	for name, ready := range map[string]corev1.ConditionStatus{"gpu-down": corev1.ConditionUnknown, "gpu-up": corev1.ConditionTrue} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		must(t, c.Create(ctx, n))
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		must(t, c.Status().Update(ctx, n))
	}
	agentPod("loom-node-agent-down", "gpu-down")
	agentPod("loom-node-agent-gone", "gpu-deleted")
	// A deleted pod on a Ready node goes once its kubelet stops it.
	up := agentPod("loom-node-agent-up", "gpu-up")
	var out bytes.Buffer
	pods, err := writerPods(ctx, c, "loom-system", ds.UID, nil)
	if err != nil || !slices.Equal(pods.left, []string{"node agent pod loom-node-agent-up"}) {
		t.Fatalf("pods waited for: %v (%v)", pods, err)
	}
	must(t, c.Delete(ctx, up, client.GracePeriodSeconds(0)))

	cfg := Config{Namespace: "loom-system", ManagerDeployment: "loom-manager", AgentDaemonSet: "loom-node-agent",
		Lease: "loom-manager", Timeout: 3 * time.Second, Poll: 100 * time.Millisecond}
	if err := Run(ctx, c, cfg, &out); err != nil {
		t.Fatalf("cleanup with agent pods left on dead nodes: %v\n%s", err, out.String())
	}
	for _, want := range []string{"not waited for node agent pod loom-node-agent-down on node gpu-down, node agent pod loom-node-agent-gone on node gpu-deleted",
		"deleted 1 GPUNodes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
