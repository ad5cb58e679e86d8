package driverupgrade

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// envNode creates a Ready node with labels on the API server.
func envNode(t *testing.T, name string, unschedulable bool, labels map[string]string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	n.Spec.Unschedulable = unschedulable
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	return n
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The claim, first state and cordon are one patch conditional on the
// node as it was read: a node changed since gets none of them.
func TestClaimPatchConflict(t *testing.T) {
	ctx := context.Background()
	read := envNode(t, "claim-conflict", false, map[string]string{gpuv1alpha1.LabelPresent: "true"})
	read = getNode(t, read.Name)
	changed := read.DeepCopy()
	changed.Labels["someone"] = "else"
	if err := env.Client.Update(ctx, changed); err != nil {
		t.Fatal(err)
	}
	r := New(env.Client, env.Client, loomNS)
	_, acts := next(read, driverPod("old-template", true), nil, target{claim: policy, template: wanted, start: true}, t0)
	if err := r.execute(ctx, read, acts); !apierrors.IsConflict(err) {
		t.Fatalf("execute on a stale read: %v, want a conflict", err)
	}
	got := getNode(t, read.Name)
	if got.Spec.Unschedulable || got.Annotations[gpuv1alpha1.AnnotationClaim] != "" || got.Labels[gpuv1alpha1.LabelUpgradeState] != "" {
		t.Errorf("after the conflict: unschedulable %v, labels %v, annotations %v", got.Spec.Unschedulable, got.Labels, got.Annotations)
	}
	_, acts = next(got, driverPod("old-template", true), nil, target{claim: policy, template: wanted, start: true}, t0)
	if err := r.execute(ctx, got, acts); err != nil {
		t.Fatal(err)
	}
	if got = getNode(t, read.Name); !got.Spec.Unschedulable || got.Annotations[gpuv1alpha1.AnnotationClaim] != policy ||
		got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.UpgradeRequired || !gpuv1alpha1.ManagesUnschedulable(got.ManagedFields, FieldOwner) {
		t.Errorf("after a fresh read: unschedulable %v, labels %v, annotations %v", got.Spec.Unschedulable, got.Labels, got.Annotations)
	}
}

// A pass against the API server: a node with GPU Operator's leftover label
// is neither claimed nor cordoned nor counted, and is named in the
// DriverUpgrade condition; a node whose presence label went is still
// stepped; deleting the policy mid-upgrade uncordons the nodes Loom
// cordoned and removes its label and annotations, leaving a user's cordon.
func TestReconcileClaimsAndReleases(t *testing.T) {
	ctx := context.Background()
	if err := env.CreateNamespace(ctx, loomNS); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: policy}}
	cp.Spec.Driver.UpgradePolicy = gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0), MaxUnavailable: ptr.To(intstr.FromInt32(10))}
	if err := env.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: "loom-driver-ubuntu22.04",
		Labels:          map[string]string{gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver, "app.kubernetes.io/managed-by": "loom"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: gpuv1alpha1.GroupVersion.String(), Kind: "ClusterPolicy", Name: cp.Name, UID: cp.UID, Controller: ptr.To(true)}}}}
	ds.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "driver"}}
	ds.Spec.Template.Labels = map[string]string{"app": "driver"}
	ds.Spec.Template.Annotations = map[string]string{gpuv1alpha1.AnnotationTemplateHash: wanted}
	ds.Spec.Template.Spec.Containers = []corev1.Container{{Name: "driver", Image: "driver"}}
	if err := env.Client.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	present := map[string]string{gpuv1alpha1.LabelPresent: "true"}
	envNode(t, "mine", false, present)
	envNode(t, "users", true, present)
	envNode(t, "gone-label", false, nil) // a driver pod, no presence label
	envNode(t, "operators", true, map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelUpgradeState: gpuv1alpha1.DrainRequired})
	for _, n := range []string{"mine", "users", "gone-label", "operators"} {
		p := driverPod("old-template", true)
		p.Name = "loom-driver-" + n
		p.Labels = map[string]string{"app.kubernetes.io/managed-by": "loom", gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver, "app": "driver"}
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}}
		p.Spec.NodeName = n
		p.Spec.Containers = []corev1.Container{{Name: "driver", Image: "driver"}}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	r := New(env.Client, env.Client, loomNS)
	r.Now = func() time.Time { return t0 }
	req := ctrl.Request{NamespacedName: client.ObjectKey{Name: cp.Name}}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	for name, cordoned := range map[string]bool{"mine": true, "users": true, "gone-label": true} {
		n := getNode(t, name)
		if n.Annotations[gpuv1alpha1.AnnotationClaim] != policy || n.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.UpgradeRequired || n.Spec.Unschedulable != cordoned {
			t.Errorf("%s: labels %v, annotations %v, unschedulable %v", name, n.Labels, n.Annotations, n.Spec.Unschedulable)
		}
		if len(n.ManagedFields) > 0 && !gpuv1alpha1.ManagesUnschedulable(n.ManagedFields, FieldOwner) && name != "users" {
			t.Errorf("%s: Loom does not manage its cordon: %v", name, n.ManagedFields)
		}
	}
	if n := getNode(t, "operators"); n.Annotations[gpuv1alpha1.AnnotationClaim] != "" || n.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.DrainRequired {
		t.Errorf("the foreign node was touched: %v %v", n.Labels, n.Annotations)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade)
	if c == nil || c.Reason != gpuv1alpha1.ReasonUpgradeInProgress || !strings.Contains(c.Message, "ignored: 1 nodes carry") || !strings.HasSuffix(c.Message, ": operators") {
		t.Errorf("condition %+v", c)
	}

	if err := env.Client.Delete(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	for name, cordoned := range map[string]bool{"mine": false, "users": true, "gone-label": false, "operators": true} {
		n := getNode(t, name)
		var left []string
		for k := range n.Annotations {
			if strings.HasPrefix(k, upgradeAnnotationPrefix) {
				left = append(left, k)
			}
		}
		wantState := ""
		if name == "operators" {
			wantState = gpuv1alpha1.DrainRequired
		}
		if n.Spec.Unschedulable != cordoned || len(left) > 0 || n.Labels[gpuv1alpha1.LabelUpgradeState] != wantState {
			t.Errorf("after the policy's deletion, %s: unschedulable %v (want %v), state %q, annotations %v", name, n.Spec.Unschedulable, cordoned,
				n.Labels[gpuv1alpha1.LabelUpgradeState], left)
		}
	}
}

// envDriver creates a ClusterPolicy named name with upgrade policy p and
// its driver DaemonSet of template wanted, whose pod spec is spec.
func envDriver(t *testing.T, name string, p gpuv1alpha1.DriverUpgradePolicy, spec corev1.PodSpec) (*gpuv1alpha1.ClusterPolicy, *appsv1.DaemonSet) {
	t.Helper()
	ctx := context.Background()
	if err := env.CreateNamespace(ctx, loomNS); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}
	cp.Spec.Driver.UpgradePolicy = p
	if err := env.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cp) })
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: "loom-driver-" + name,
		Labels:          map[string]string{gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver, "app.kubernetes.io/managed-by": "loom"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: gpuv1alpha1.GroupVersion.String(), Kind: "ClusterPolicy", Name: cp.Name, UID: cp.UID, Controller: ptr.To(true)}}}}
	ds.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "driver-" + name}}
	ds.Spec.Template.Labels = map[string]string{"app": "driver-" + name}
	ds.Spec.Template.Annotations = map[string]string{gpuv1alpha1.AnnotationTemplateHash: wanted}
	ds.Spec.Template.Spec = spec
	ds.Spec.Template.Spec.Containers = []corev1.Container{{Name: "driver", Image: "driver"}}
	if err := env.Client.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ds) })
	return cp, ds
}

// envDriverPod creates a driver pod of ds, of template, on node.
func envDriverPod(t *testing.T, ds *appsv1.DaemonSet, node, template string) {
	t.Helper()
	p := driverPod(template, true)
	p.Name = ds.Name + "-" + node
	p.Labels = map[string]string{"app.kubernetes.io/managed-by": "loom", gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver, "app": ds.Spec.Template.Labels["app"]}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}}
	p.Spec.NodeName = node
	p.Spec.Containers = []corev1.Container{{Name: "driver", Image: "driver"}}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
}

// A node that leaves the driver DaemonSet's placement mid-upgrade (opted
// out with nvidia.com/gpu.deploy.driver=false) or after failing (a taint
// the driver does not tolerate) can never run the new driver: Loom lets go
// of it (its own cordon lifted, its state and annotations removed), says
// why in an event and the DriverUpgrade condition, and the failure does
// not pause the rollout. A node still placed goes on.
func TestReconcileLetsGoOfNodesTheDriverLeaves(t *testing.T) {
	ctx := context.Background()
	const name = "leaving"
	cp, ds := envDriver(t, name, gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0), MaxUnavailable: ptr.To(intstr.FromInt32(10))}, driverTemplate())
	present := map[string]string{gpuv1alpha1.LabelPresent: "true"}
	for _, n := range []string{"leaves", "stays", "tainted"} {
		envNode(t, "leave-"+n, false, present)
		envDriverPod(t, ds, "leave-"+n, "old-template")
	}
	rec := &events{}
	r := New(env.Client, env.Client, loomNS)
	r.Now = func() time.Time { return t0 }
	r.Recorder = rec
	req := ctrl.Request{NamespacedName: client.ObjectKey{Name: name}}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"leaves", "stays", "tainted"} {
		if got := getNode(t, "leave-"+n); got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.UpgradeRequired || !got.Spec.Unschedulable {
			t.Fatalf("%s not enrolled: %v", n, got.Labels)
		}
	}
	leaves := getNode(t, "leave-leaves")
	leaves.Labels["nvidia.com/gpu.deploy.driver"] = "false"
	if err := env.Client.Update(ctx, leaves); err != nil {
		t.Fatal(err)
	}
	tainted := getNode(t, "leave-tainted")
	tainted.Labels[gpuv1alpha1.LabelUpgradeState] = gpuv1alpha1.UpgradeFailed
	tainted.Annotations[gpuv1alpha1.AnnotationFailedTemplate] = wanted
	tainted.Annotations[gpuv1alpha1.AnnotationFailure] = "the new driver pod was not ready within 10m0s"
	tainted.Spec.Taints = append(tainted.Spec.Taints, corev1.Taint{Key: "dedicated", Value: "infer", Effect: corev1.TaintEffectNoSchedule})
	if err := env.Client.Update(ctx, tainted); err != nil {
		t.Fatal(err)
	}
	rec.got = nil
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"leaves", "tainted"} {
		got := getNode(t, "leave-"+n)
		var left []string
		for k := range got.Annotations {
			if strings.HasPrefix(k, upgradeAnnotationPrefix) {
				left = append(left, k)
			}
		}
		if got.Spec.Unschedulable || got.Labels[gpuv1alpha1.LabelUpgradeState] != "" || len(left) > 0 {
			t.Errorf("%s, no longer selected by the driver: unschedulable %v, state %q, annotations %v", n, got.Spec.Unschedulable,
				got.Labels[gpuv1alpha1.LabelUpgradeState], left)
		}
	}
	if got := getNode(t, "leave-stays"); got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.WaitForJobsRequired {
		t.Errorf("the node still selected: state %q", got.Labels[gpuv1alpha1.LabelUpgradeState])
	}
	released := 0
	for _, e := range rec.got {
		if strings.Contains(e, "Release: Loom released the node from its driver upgrade (no driver DaemonSet of its policy selects the node") {
			released++
		}
	}
	if released != 2 {
		t.Errorf("events %q, want two releases saying why", rec.got)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade)
	if c == nil || c.Reason != gpuv1alpha1.ReasonUpgradeInProgress ||
		!strings.Contains(c.Message, "2 GPU nodes run no driver of this policy (no driver DaemonSet selects them: ") ||
		!strings.HasSuffix(c.Message, ": leave-leaves, leave-tainted") {
		t.Errorf("condition %+v", c)
	}
}

// A node deleted between a pass's read and its step is no error: it has
// left the upgrade, and the next pass's set no longer has it.
func TestStepNodeDeletedMidUpgrade(t *testing.T) {
	ctx := context.Background()
	const name = "deleted"
	_, ds := envDriver(t, name, gpuv1alpha1.DriverUpgradePolicy{}, corev1.PodSpec{})
	envNode(t, "deleted-0", false, map[string]string{gpuv1alpha1.LabelPresent: "true"})
	envDriverPod(t, ds, "deleted-0", "old-template")
	r := New(env.Client, env.Client, loomNS)
	r.Now = func() time.Time { return t0 }
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: name}}); err != nil {
		t.Fatal(err)
	}
	obs, err := r.observe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	pl := plan(obs.nodes, obs.cp.Spec.Driver.UpgradePolicy, name, false)
	if showWork(pl.todo) != "deleted-0" {
		t.Fatalf("plan %q", showWork(pl.todo))
	}
	if err := env.Client.Delete(ctx, getNode(t, "deleted-0")); err != nil {
		t.Fatal(err)
	}
	if retry, errs := r.step(ctx, obs, name, pl.todo); len(errs) > 0 || !retry {
		t.Errorf("step on a deleted node: retry %v, errors %v; want a retry and no error", retry, errs)
	}
}

// setReady sets the node's Ready condition to status since when.
func setReady(t *testing.T, name string, status corev1.ConditionStatus, when time.Time) {
	t.Helper()
	n := getNode(t, name)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(when)}}
	if err := env.Client.Status().Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

// A node lost mid-upgrade (NotReady for more than 10 minutes) fails,
// naming how long it was NotReady, and its failure pauses the rollout
// (maxFailures 1); Ready again, it is enrolled again first and the
// rollout is no longer paused.
func TestReconcileLostNodeFailsAndRetriesWhenBack(t *testing.T) {
	ctx := context.Background()
	const name = "lost"
	cp, ds := envDriver(t, name, gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1), MaxUnavailable: ptr.To(intstr.FromInt32(10))}, corev1.PodSpec{})
	for _, n := range []string{"lost-a", "lost-b"} {
		envNode(t, n, false, map[string]string{gpuv1alpha1.LabelPresent: "true"})
		envDriverPod(t, ds, n, "old-template")
	}
	now := t0
	r := New(env.Client, env.Client, loomNS)
	r.Now = func() time.Time { return now }
	req := ctrl.Request{NamespacedName: client.ObjectKey{Name: name}}
	pass := func() ctrl.Result {
		t.Helper()
		res, err := r.Reconcile(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	condition := func() *metav1.Condition {
		t.Helper()
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade)
	}
	pass()
	if got := getNode(t, "lost-a"); got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.UpgradeRequired {
		t.Fatalf("lost-a not enrolled: %v", got.Labels)
	}
	setReady(t, "lost-a", corev1.ConditionUnknown, t0)
	now = t0.Add(10 * time.Minute)
	pass()
	if got := getNode(t, "lost-a"); got.Labels[gpuv1alpha1.LabelUpgradeState] == gpuv1alpha1.UpgradeFailed {
		t.Fatalf("lost-a failed after 10 minutes NotReady: %v", got.Annotations)
	}
	now = t0.Add(11 * time.Minute)
	for got := getNode(t, "lost-a"); got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.UpgradeFailed; got = getNode(t, "lost-a") {
		if now.After(t0.Add(12 * time.Minute)) {
			t.Fatalf("lost-a, NotReady for 11 minutes: state %q", got.Labels[gpuv1alpha1.LabelUpgradeState])
		}
		pass()
		now = now.Add(time.Second)
	}
	a := getNode(t, "lost-a")
	if !a.Spec.Unschedulable || a.Annotations[gpuv1alpha1.AnnotationFailedNotReady] != "true" ||
		!strings.HasPrefix(a.Annotations[gpuv1alpha1.AnnotationFailure], "node lost-a was NotReady for 11m") {
		t.Errorf("lost-a: unschedulable %v, annotations %v", a.Spec.Unschedulable, a.Annotations)
	}
	pass()
	if c := condition(); c == nil || c.Reason != gpuv1alpha1.ReasonUpgradePaused ||
		!strings.Contains(c.Message, "1 failed nodes were NotReady for more than 10m0s (their slots are free; each retries once Ready): lost-a") {
		t.Errorf("condition %+v", c)
	}
	if got := getNode(t, "lost-b"); got.Labels[gpuv1alpha1.LabelUpgradeState] != "" {
		t.Errorf("lost-b started while the rollout is paused: %v", got.Labels)
	}

	setReady(t, "lost-a", corev1.ConditionTrue, now)
	pass()
	if got := getNode(t, "lost-a"); got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.UpgradeRequired || !got.Spec.Unschedulable ||
		got.Annotations[gpuv1alpha1.AnnotationFailedNotReady] != "" || got.Annotations[gpuv1alpha1.AnnotationFailure] != "" {
		t.Errorf("lost-a, Ready again: state %q, annotations %v", got.Labels[gpuv1alpha1.LabelUpgradeState], got.Annotations)
	}
	if got := getNode(t, "lost-b"); got.Labels[gpuv1alpha1.LabelUpgradeState] != "" {
		t.Errorf("lost-b started beside the retried lost-a (maxParallelUpgrades 1): %v", got.Labels)
	}
	if c := condition(); c == nil || c.Reason != gpuv1alpha1.ReasonUpgradeInProgress {
		t.Errorf("condition after lost-a is back %+v", c)
	}
}

// A per-OS driver DaemonSet deleted and recreated mid-upgrade (another
// OS's still there) does not release its OS's nodes: they keep their
// claim, state and cordon, and go on once it is back.
func TestReconcileKeepsNodesWhileTheirOSDaemonSetIsRecreated(t *testing.T) {
	ctx := context.Background()
	const name = "recreate"
	cp, rhel := envDriver(t, name, gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0), MaxUnavailable: ptr.To(intstr.FromInt32(10))},
		perOS("rhel", "9.4"))
	newUbuntu := func() *appsv1.DaemonSet {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: "loom-driver-recreate-ubuntu22.04",
			Labels:          map[string]string{gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver, "app.kubernetes.io/managed-by": "loom"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: gpuv1alpha1.GroupVersion.String(), Kind: "ClusterPolicy", Name: cp.Name, UID: cp.UID, Controller: ptr.To(true)}}}}
		ds.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "driver-recreate-ubuntu"}}
		ds.Spec.Template.Labels = map[string]string{"app": "driver-recreate-ubuntu"}
		ds.Spec.Template.Annotations = map[string]string{gpuv1alpha1.AnnotationTemplateHash: wanted}
		ds.Spec.Template.Spec = perOS("ubuntu", "22.04")
		ds.Spec.Template.Spec.Containers = []corev1.Container{{Name: "driver", Image: "driver"}}
		if err := env.Client.Create(ctx, ds); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ds) })
		return ds
	}
	ubuntu := newUbuntu()
	nfd := func(id, version string) map[string]string {
		return map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelOSReleaseID: id, gpuv1alpha1.LabelOSReleaseVersionID: version}
	}
	envNode(t, "recreate-r", false, nfd("rhel", "9.4"))
	envDriverPod(t, rhel, "recreate-r", "old-template")
	envNode(t, "recreate-u", false, nfd("ubuntu", "22.04"))
	envDriverPod(t, ubuntu, "recreate-u", "old-template")
	r := New(env.Client, env.Client, loomNS)
	r.Now = func() time.Time { return t0 }
	req := ctrl.Request{NamespacedName: client.ObjectKey{Name: name}}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, ubuntu); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"recreate-r", "recreate-u"} {
		if got := getNode(t, n); got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.WaitForJobsRequired || !got.Spec.Unschedulable ||
			got.Annotations[gpuv1alpha1.AnnotationClaim] != name {
			t.Errorf("%s, its OS's DaemonSet being recreated: unschedulable %v, labels %v, annotations %v", n, got.Spec.Unschedulable, got.Labels, got.Annotations)
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade); c == nil || strings.Contains(c.Message, "run no driver of this policy") {
		t.Errorf("condition %+v", c)
	}
	newUbuntu()
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := getNode(t, "recreate-u"); got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.PodDeletionRequired {
		t.Errorf("recreate-u, its DaemonSet back: state %q", got.Labels[gpuv1alpha1.LabelUpgradeState])
	}
}

// A claimed node whose time annotations Loom cannot count from (a
// careless edit, a clock far ahead) is not failed at once nor stalled:
// its step's clock restarts from the pass that finds them, and its
// timeout counts from there.
func TestReconcileRestartsUnusableClocks(t *testing.T) {
	ctx := context.Background()
	const name = "clocks"
	_, ds := envDriver(t, name, gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1), MaxUnavailable: ptr.To(intstr.FromInt32(10))}, corev1.PodSpec{})
	n := envNode(t, "clocks-a", true, map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelUpgradeState: gpuv1alpha1.ValidationRequired})
	envDriverPod(t, ds, n.Name, "old-template")
	setReady(t, n.Name, corev1.ConditionTrue, t0.Add(-time.Hour))
	n = getNode(t, n.Name)
	n.Annotations = map[string]string{gpuv1alpha1.AnnotationClaim: name, gpuv1alpha1.AnnotationTarget: wanted,
		gpuv1alpha1.AnnotationPhaseStarted: "last tuesday", gpuv1alpha1.AnnotationUpgradeStarted: "2999-01-01T00:00:00Z"}
	if err := env.Client.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	now := t0
	r := New(env.Client, env.Client, loomNS)
	r.Now = func() time.Time { return now }
	pass := func() {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	pass()
	got := getNode(t, n.Name)
	if s := got.Labels[gpuv1alpha1.LabelUpgradeState]; s != gpuv1alpha1.ValidationRequired ||
		got.Annotations[gpuv1alpha1.AnnotationPhaseStarted] != t0.Format(time.RFC3339) || got.Annotations[gpuv1alpha1.AnnotationUpgradeStarted] != t0.Format(time.RFC3339) {
		t.Fatalf("state %q, annotations %v: want validation-required, both clocks restarted at %s", s, got.Annotations, t0.Format(time.RFC3339))
	}
	now = t0.Add(10 * time.Minute)
	pass()
	if s := getNode(t, n.Name).Labels[gpuv1alpha1.LabelUpgradeState]; s != gpuv1alpha1.ValidationRequired {
		t.Fatalf("10 minutes after the restart: state %q", s)
	}
	now = t0.Add(10*time.Minute + time.Second)
	pass()
	if got := getNode(t, n.Name); got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.UpgradeFailed ||
		!strings.Contains(got.Annotations[gpuv1alpha1.AnnotationFailure], "still runs the old driver") {
		t.Errorf("past the timeout from the restart: state %q, annotations %v", got.Labels[gpuv1alpha1.LabelUpgradeState], got.Annotations)
	}
}

// A node lost in a step of its upgrade (NotReady too long while its new
// driver is validated: the driver may be what takes it down; or while it
// waits for its jobs: a flapping kubelet) is retried once Ready, once per
// step and driver version: lost in that step again on the same version, it
// stays failed, counting towards maxFailures, and Ready again it is not
// retried, so it no longer holds its upgrade slot each time it returns.
func TestReconcileNodeLostTwiceInAStepStaysFailed(t *testing.T) {
	for _, tc := range []struct{ step, state string }{
		{"driver", gpuv1alpha1.ValidationRequired},
		{"wait-for-jobs", gpuv1alpha1.WaitForJobsRequired},
	} {
		t.Run(tc.step, func(t *testing.T) { testLostTwice(t, tc.step, tc.state) })
	}
}

func testLostTwice(t *testing.T, step, state string) {
	ctx := context.Background()
	name := "lost-twice-" + step
	cp, ds := envDriver(t, name, gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1), MaxUnavailable: ptr.To(intstr.FromInt32(10)),
		MaxFailures: ptr.To[int32](0), WaitForCompletion: &gpuv1alpha1.WaitForCompletionSpec{PodSelector: "job=" + name}}, corev1.PodSpec{})
	n := envNode(t, name+"-a", false, map[string]string{gpuv1alpha1.LabelPresent: "true"})
	envDriverPod(t, ds, n.Name, "old-template")
	if state == gpuv1alpha1.WaitForJobsRequired {
		job := pod("train", labelled("job", name), bare)
		job.Name, job.Spec.NodeName = name, n.Name
		job.Spec.Containers = []corev1.Container{{Name: "train", Image: "train"}}
		if err := env.Client.Create(ctx, &job); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), &job, client.GracePeriodSeconds(0)) })
	}
	now := t0
	r := New(env.Client, env.Client, loomNS)
	r.Now = func() time.Time { return now }
	pass := func() {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	// toStep passes until the node is in state (in validation: the old
	// driver pod deleted; no DaemonSet controller makes the new one).
	toStep := func() {
		t.Helper()
		for i := 0; getNode(t, n.Name).Labels[gpuv1alpha1.LabelUpgradeState] != state; i++ {
			if i == 10 {
				t.Fatalf("not in %s after 10 passes: %v", state, getNode(t, n.Name).Labels)
			}
			pass()
		}
	}
	lose := func() *corev1.Node {
		t.Helper()
		setReady(t, n.Name, corev1.ConditionFalse, now)
		now = now.Add(11 * time.Minute)
		pass()
		got := getNode(t, n.Name)
		if got.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.UpgradeFailed {
			t.Fatalf("NotReady for 11 minutes in %s: state %q", state, got.Labels[gpuv1alpha1.LabelUpgradeState])
		}
		setReady(t, n.Name, corev1.ConditionTrue, now)
		now = now.Add(time.Minute)
		pass()
		return got
	}
	toStep()
	if got := lose(); got.Annotations[gpuv1alpha1.AnnotationFailedNotReady] != "true" || got.Annotations[gpuv1alpha1.AnnotationLost] != step+":"+wanted {
		t.Fatalf("lost the first time: annotations %v", got.Annotations)
	}
	if s := getNode(t, n.Name).Labels[gpuv1alpha1.LabelUpgradeState]; s != gpuv1alpha1.UpgradeRequired {
		t.Fatalf("lost the first time, Ready again: state %q, want a retry", s)
	}
	toStep()
	got := lose()
	if got.Annotations[gpuv1alpha1.AnnotationFailedNotReady] != "" ||
		!strings.Contains(got.Annotations[gpuv1alpha1.AnnotationFailure], "the second time in its "+step+" step on this driver version: it stays failed") {
		t.Fatalf("lost the second time: annotations %v", got.Annotations)
	}
	for range 3 {
		now = now.Add(time.Minute)
		pass()
	}
	if s := getNode(t, n.Name).Labels[gpuv1alpha1.LabelUpgradeState]; s != gpuv1alpha1.UpgradeFailed {
		t.Errorf("lost the second time, Ready again: state %q, want it to stay failed", s)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade); c == nil || !strings.Contains(c.Message, "failed (1): "+n.Name) {
		t.Errorf("condition %+v", c)
	}
}

// A deleted policy's gauges go with it: its failed node, released with
// it, must not keep loom_driver_upgrade_nodes{state="failed"} (and
// LoomGPUDriverUpgradeFailed) up until the manager restarts.
func TestReconcileForgetsTheGaugesOfADeletedPolicy(t *testing.T) {
	ctx := context.Background()
	const name = "forgotten"
	cp, ds := envDriver(t, name, gpuv1alpha1.DriverUpgradePolicy{}, corev1.PodSpec{})
	envNode(t, "forgotten-0", true, map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelUpgradeState: gpuv1alpha1.UpgradeFailed})
	n := getNode(t, "forgotten-0")
	n.Annotations = map[string]string{gpuv1alpha1.AnnotationClaim: name, gpuv1alpha1.AnnotationFailedTemplate: wanted,
		gpuv1alpha1.AnnotationFailure: "the new driver pod was not ready within 10m0s", gpuv1alpha1.AnnotationUpgradeStarted: t0.Format(time.RFC3339)}
	if err := env.Client.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	envDriverPod(t, ds, "forgotten-0", "old-template")
	r := New(env.Client, env.Client, loomNS)
	r.Now = func() time.Time { return t0 }
	req := ctrl.Request{NamespacedName: client.ObjectKey{Name: name}}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(upgradeNodes.WithLabelValues(name, "failed")); got != 1 {
		t.Fatalf("failed nodes gauge %v, want 1", got)
	}
	if err := env.Client.Delete(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := getNode(t, "forgotten-0"); got.Annotations[gpuv1alpha1.AnnotationClaim] != "" || got.Labels[gpuv1alpha1.LabelUpgradeState] != "" {
		t.Errorf("the failed node was not released: %v %v", got.Labels, got.Annotations)
	}
	for _, state := range []string{"done", "pending", "in_progress", "failed"} {
		if upgradeNodes.DeleteLabelValues(name, state) {
			t.Errorf("loom_driver_upgrade_nodes{policy=%q,state=%q} outlived its policy", name, state)
		}
	}
}

// A GPU pool scaled to zero mid-upgrade (its nodes, their driver pods and
// the policy's driver DaemonSets gone) leaves nothing in progress: the
// DriverUpgrade condition says so, instead of keeping UpgradeInProgress
// until GPU nodes return. A policy that has said nothing yet, before its
// first driver DaemonSet, still gets no condition.
func TestReconcilePoolScaledToZero(t *testing.T) {
	ctx := context.Background()
	const name = "scaled"
	cp, ds := envDriver(t, name, gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0), MaxUnavailable: ptr.To(intstr.FromInt32(10))},
		corev1.PodSpec{})
	envNode(t, "scaled-a", false, map[string]string{gpuv1alpha1.LabelPresent: "true"})
	envDriverPod(t, ds, "scaled-a", "old-template")
	r := New(env.Client, env.Client, loomNS)
	r.Now = func() time.Time { return t0 }
	req := ctrl.Request{NamespacedName: client.ObjectKey{Name: name}}
	condition := func() *metav1.Condition {
		t.Helper()
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if c := condition(); c == nil || c.Reason != gpuv1alpha1.ReasonUpgradeInProgress {
		t.Fatalf("mid-upgrade: condition %+v", c)
	}
	for _, o := range []client.Object{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: ds.Name + "-scaled-a"}}, ds,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "scaled-a"}}} {
		if err := env.Client.Delete(ctx, o, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if c := condition(); c == nil || c.Status != metav1.ConditionTrue || c.Reason != gpuv1alpha1.ReasonUpgradeUpToDate {
		t.Errorf("the pool scaled to zero: condition %+v", c)
	}

	fresh := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "scaled-fresh"}}
	if err := env.Client.Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), fresh) })
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: fresh.Name}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(fresh), fresh); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(fresh.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade); c != nil {
		t.Errorf("a policy without driver DaemonSets yet got %+v", c)
	}
}
