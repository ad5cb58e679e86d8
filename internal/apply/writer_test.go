package apply_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

const ns = "writer-test"

// owner is a real object (a Namespace's UID makes a valid owner reference).
func owner(t *testing.T, name string) *corev1.ConfigMap {
	t.Helper()
	ctx := context.Background()
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	o := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if err := env.Client.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	return o
}

func child(name, value string) *corev1.ConfigMap {
	return &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "x"}},
		Data:       map[string]string{"k": value}}
}

func get(t *testing.T, name string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cm); err != nil {
		t.Fatal(err)
	}
	return cm
}

// The writer creates a child once, skips a write while the cache shows
// what it applied, repairs another writer's edit, and changes the child
// when the desired state changes.
func TestEnsureWritesOnlyWhatChanged(t *testing.T) {
	ctx := context.Background()
	w := apply.NewWriter(env.Client, "test-ensure", apply.Options{})
	o := owner(t, "ensure-owner")

	if err := w.Ensure(ctx, o, child("ensure-child", "1")); err != nil {
		t.Fatal(err)
	}
	first := get(t, "ensure-child")
	if first.Labels[apply.LabelManagedBy] != apply.ManagedBy || !metav1.IsControlledBy(first, o) || first.Annotations[apply.AnnotationHash] == "" {
		t.Fatalf("child lacks Loom's label, owner or hash: %+v", first.ObjectMeta)
	}
	if err := w.Ensure(ctx, o, child("ensure-child", "1")); err != nil {
		t.Fatal(err)
	}
	if rv := get(t, "ensure-child").ResourceVersion; rv != first.ResourceVersion {
		t.Fatalf("an unchanged child was written again (resourceVersion %s -> %s)", first.ResourceVersion, rv)
	}
	if w, s := testenv.WritesCounted(t, "ConfigMap", "test-ensure", "apply", "written"), testenv.WritesCounted(t, "ConfigMap", "test-ensure", "apply", "skipped"); w != 1 || s != 1 {
		t.Fatalf("loom_writes_total: %v written, %v skipped; want 1 and 1", w, s)
	}

	edited := first.DeepCopy()
	edited.Data["k"] = "edited by hand"
	if err := env.Client.Update(ctx, edited); err != nil {
		t.Fatal(err)
	}
	if err := w.Ensure(ctx, o, child("ensure-child", "1")); err != nil {
		t.Fatal(err)
	}
	if got := get(t, "ensure-child").Data["k"]; got != "1" {
		t.Fatalf("another writer's edit was not repaired: %q", got)
	}

	if err := w.Ensure(ctx, o, child("ensure-child", "2")); err != nil {
		t.Fatal(err)
	}
	if got := get(t, "ensure-child").Data["k"]; got != "2" {
		t.Fatalf("a changed desired state was not applied: %q", got)
	}
}

// daemonSet is an operand-like DaemonSet: fields the server defaults
// (pull policy, termination message path, protocols, the update strategy,
// a fieldRef's apiVersion) beside those the writer sets.
func daemonSet(name string) *appsv1.DaemonSet {
	labels := map[string]string{"app": "drift"}
	return &appsv1.DaemonSet{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{"loom.dev/set": "by-loom"}},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"nvidia.com/gpu.present": "true"},
				Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{Name: "exporter", Image: "nvcr.io/dcgm-exporter:4.2", Args: []string{"-f", "/etc/counters.csv"},
					Env:             []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
					Ports:           []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9400}},
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
					Resources:       corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi"), corev1.ResourceCPU: resource.MustParse("1000m")}}}},
				Volumes: []corev1.Volume{{Name: "run", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/nvidia"}}}}}}}}
}

// service is a Ray head-like Service; the server fills its cluster IP,
// protocols, session affinity and traffic policies.
func service(name string) *corev1.Service {
	return &corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"ray.io/node-type": "head"},
			Ports: []corev1.ServicePort{{Name: "dashboard", Port: 8265, TargetPort: intstr.FromString("dashboard")}, {Name: "gcs", Port: 6379}}}}
}

func podGroup(name string) *schedulingv1beta1.PodGroup {
	return &schedulingv1beta1.PodGroup{TypeMeta: metav1.TypeMeta{APIVersion: "scheduling.volcano.sh/v1beta1", Kind: "PodGroup"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: schedulingv1beta1.PodGroupSpec{MinMember: 4}}
}

// restartCase is a child written by one writer, edited while no writer
// runs, then seen by a new one (a restarted manager, a new leader).
type restartCase struct {
	name string
	want func() client.Object
	edit func(client.Object)
}

// ensureAfterRestart applies want with one writer, edits the child as
// edit says, and has a fresh writer of the same field owner ensure it;
// it returns the child as the first writer left it, after the edit, and
// after the fresh writer.
func ensureAfterRestart(t *testing.T, fieldOwner, name string, c restartCase) (applied, edited, after client.Object) {
	t.Helper()
	ctx := context.Background()
	o := env.Client
	opts := apply.Options{SpecOnly: []schema.GroupKind{gang.PodGroupKind},
		MetadataOnly: []schema.GroupKind{{Group: rbacv1.GroupName, Kind: "Role"}}}
	parent := owner(t, name+"-owner")
	if err := apply.NewWriter(o, fieldOwner, opts).Ensure(ctx, parent, c.want()); err != nil {
		t.Fatal(err)
	}
	read := func() client.Object {
		obj := c.want()
		if err := o.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		return obj
	}
	applied = read()
	edited = applied.DeepCopyObject().(client.Object)
	if c.edit != nil {
		c.edit(edited)
		if err := o.Update(ctx, edited); err != nil {
			t.Fatal(err)
		}
	}
	opts.Live = o // the restarted writer reads a metadata-only child whole once
	if err := apply.NewWriter(o, fieldOwner, opts).Ensure(ctx, parent, c.want()); err != nil {
		t.Fatal(err)
	}
	return applied, edited, read()
}

// A writer that starts fresh (a restarted manager) trusts the hash on the
// child it applied before, and the fields it finds as applied, whatever
// the server defaulted: no write.
func TestEnsureAfterRestartTrustsTheHash(t *testing.T) {
	for _, c := range []restartCase{
		{name: "configmap", want: func() client.Object { return child("restart-child", "1") }},
		{name: "daemonset", want: func() client.Object { return daemonSet("trusts-ds") }},
		{name: "service", want: func() client.Object { return service("trusts-svc") }},
		{name: "podgroup", want: func() client.Object { return podGroup("trusts-pg") }},
		{name: "role", want: func() client.Object { return role("trusts-role") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			fo := "test-restart-" + c.name
			applied, _, after := ensureAfterRestart(t, fo, "trusts-"+c.name, c)
			if after.GetResourceVersion() != applied.GetResourceVersion() {
				t.Fatalf("a new writer rewrote an up-to-date %s (%s -> %s)", c.name, applied.GetResourceVersion(), after.GetResourceVersion())
			}
			if n := testenv.WritesCounted(t, kindOf(c.want()), fo, "apply", "written"); n != 1 {
				t.Fatalf("applies counted %v, want 1 (the first writer's)", n)
			}
		})
	}
}

// A child edited while no writer ran (the manager was down) in a field the
// writer sets is put back by the first writer to see it, though its
// desired state did not change, as GPU Operator, Prometheus Operator and
// KubeRay repair such drift on their next reconcile.
func TestEnsureAfterRestartRepairsEditsMadeWhileStopped(t *testing.T) {
	for _, c := range []struct {
		restartCase
		field func(client.Object) string
	}{
		{restartCase{"configmap-data", func() client.Object { return child("stopped-cm", "1") },
			func(o client.Object) { o.(*corev1.ConfigMap).Data["k"] = "edited by hand" }},
			func(o client.Object) string { return o.(*corev1.ConfigMap).Data["k"] }},
		{restartCase{"daemonset-image", func() client.Object { return daemonSet("stopped-daemonset-image") },
			func(o client.Object) {
				o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0].Image = "evil/exporter:latest"
			}},
			func(o client.Object) string { return o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0].Image }},
		{restartCase{"daemonset-args-appended", func() client.Object { return daemonSet("stopped-daemonset-args-appended") },
			func(o client.Object) {
				c := &o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0]
				c.Args = append(c.Args, "--debug")
			}},
			func(o client.Object) string {
				return fmt.Sprint(o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0].Args)
			}},
		{restartCase{"daemonset-limit", func() client.Object { return daemonSet("stopped-daemonset-limit") },
			func(o client.Object) {
				o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("1Gi")
			}},
			func(o client.Object) string {
				return o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0].Resources.Limits.Memory().String()
			}},
		{restartCase{"daemonset-privilege-escalation", func() client.Object { return daemonSet("stopped-daemonset-privilege-escalation") },
			func(o client.Object) {
				o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
			}},
			func(o client.Object) string {
				return fmt.Sprint(*o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation)
			}},
		{restartCase{"daemonset-node-selector-removed", func() client.Object { return daemonSet("stopped-daemonset-node-selector-removed") },
			func(o client.Object) { o.(*appsv1.DaemonSet).Spec.Template.Spec.NodeSelector = nil }},
			func(o client.Object) string { return fmt.Sprint(o.(*appsv1.DaemonSet).Spec.Template.Spec.NodeSelector) }},
		{restartCase{"daemonset-annotation", func() client.Object { return daemonSet("stopped-daemonset-annotation") },
			func(o client.Object) { o.GetAnnotations()["loom.dev/set"] = "by hand" }},
			func(o client.Object) string { return o.GetAnnotations()["loom.dev/set"] }},
		{restartCase{"service-port", func() client.Object { return service("stopped-service-port") },
			func(o client.Object) { o.(*corev1.Service).Spec.Ports[0].TargetPort = intstr.FromInt32(8266) }},
			func(o client.Object) string { return o.(*corev1.Service).Spec.Ports[0].TargetPort.String() }},
		{restartCase{"service-selector", func() client.Object { return service("stopped-service-selector") },
			func(o client.Object) { o.(*corev1.Service).Spec.Selector["ray.io/node-type"] = "worker" }},
			func(o client.Object) string { return fmt.Sprint(o.(*corev1.Service).Spec.Selector) }},
		{restartCase{"podgroup-min-member", func() client.Object { return podGroup("stopped-pg") },
			func(o client.Object) { o.(*schedulingv1beta1.PodGroup).Spec.MinMember = 1 }},
			func(o client.Object) string { return fmt.Sprint(o.(*schedulingv1beta1.PodGroup).Spec.MinMember) }},
		{restartCase{"role-rules", func() client.Object { return role("stopped-role") },
			func(o client.Object) {
				o.(*rbacv1.Role).Rules[0].Verbs = append(o.(*rbacv1.Role).Rules[0].Verbs, "delete")
			}},
			func(o client.Object) string { return fmt.Sprint(o.(*rbacv1.Role).Rules) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			fo := "test-stopped-" + c.name
			applied, edited, after := ensureAfterRestart(t, fo, "stopped-"+c.name, c.restartCase)
			if c.field(edited) == c.field(applied) {
				t.Fatalf("the edit changed nothing: %s", c.field(edited))
			}
			if got, want := c.field(after), c.field(applied); got != want {
				t.Fatalf("an edit made while no writer ran was not put back: %s, want %s", got, want)
			}
		})
	}
}

// What the writer does not set, edited while no writer ran (another tool's
// annotation or label, a rollout restart's template annotation, a field the
// server defaulted, status), costs a new writer no write: a restart over a
// fleet rewrites nothing another party touched.
func TestEnsureAfterRestartLeavesOthersFields(t *testing.T) {
	others := func(o client.Object) {
		a := o.GetAnnotations()
		a["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
		o.SetAnnotations(a)
		l := o.GetLabels()
		l["team"] = "ml"
		o.SetLabels(l)
	}
	for _, c := range []restartCase{
		{"configmap", func() client.Object { return child("others-cm", "1") }, func(o client.Object) {
			others(o)
			o.(*corev1.ConfigMap).Data["added"] = "by another field manager"
		}},
		{"daemonset", func() client.Object { return daemonSet("others-ds") }, func(o client.Object) {
			others(o)
			ds := o.(*appsv1.DaemonSet)
			ds.Spec.Template.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"}
			ds.Spec.MinReadySeconds = 10
			ds.Spec.RevisionHistoryLimit = ptr.To[int32](3)
			ds.Spec.Template.Spec.Containers[0].TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
			ds.Spec.Template.Spec.Containers[0].ImagePullPolicy = corev1.PullAlways
		}},
		{"service", func() client.Object { return service("others-svc") }, func(o client.Object) {
			others(o)
			o.(*corev1.Service).Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}},
		{"podgroup", func() client.Object { return podGroup("others-pg") }, func(o client.Object) {
			others(o)
			pg := o.(*schedulingv1beta1.PodGroup)
			pg.Spec.Queue = "research"
			pg.Status.Phase = schedulingv1beta1.PodGroupRunning
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fo := "test-others-" + c.name
			_, edited, after := ensureAfterRestart(t, fo, "others-"+c.name, c)
			if after.GetResourceVersion() != edited.GetResourceVersion() {
				t.Fatalf("a new writer rewrote a %s whose own fields are as applied (%s -> %s)", c.name, edited.GetResourceVersion(), after.GetResourceVersion())
			}
			if n := testenv.WritesCounted(t, kindOf(c.want()), fo, "apply", "written"); n != 1 {
				t.Fatalf("applies counted %v, want 1 (the first writer's)", n)
			}
		})
	}
}

// role is a Role, a kind the manager caches as metadata only.
func role(name string) *rbacv1.Role {
	return &rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}}}
}

func kindOf(o client.Object) string { return o.GetObjectKind().GroupVersionKind().Kind }

// A writer that starts fresh still puts back a child another writer edits
// after the start: the first look at the child is the baseline (docs:
// "a deleted or hand-edited operand DaemonSet is restored at once", also
// after a manager restart or a leader change).
func TestEnsureAfterRestartRepairsLaterEdits(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "restart-edit-owner")
	if err := apply.NewWriter(env.Client, "test-restart-edit", apply.Options{}).Ensure(ctx, o, child("restart-edit-child", "1")); err != nil {
		t.Fatal(err)
	}
	restarted := apply.NewWriter(env.Client, "test-restart-edit", apply.Options{})
	if err := restarted.Ensure(ctx, o, child("restart-edit-child", "1")); err != nil {
		t.Fatal(err)
	}
	edited := get(t, "restart-edit-child")
	edited.Data["k"] = "edited by hand"
	if err := env.Client.Update(ctx, edited); err != nil {
		t.Fatal(err)
	}
	if err := restarted.Ensure(ctx, o, child("restart-edit-child", "1")); err != nil {
		t.Fatal(err)
	}
	if got := get(t, "restart-edit-child").Data["k"]; got != "1" {
		t.Fatalf("an edit made after the writer started was not repaired: %q", got)
	}

	// The same for a kind whose generation moves with its status.
	pgWant := func() *schedulingv1beta1.PodGroup {
		return &schedulingv1beta1.PodGroup{TypeMeta: metav1.TypeMeta{APIVersion: "scheduling.volcano.sh/v1beta1", Kind: "PodGroup"},
			ObjectMeta: metav1.ObjectMeta{Name: "restart-edit-pg", Namespace: ns}, Spec: schedulingv1beta1.PodGroupSpec{MinMember: 4}}
	}
	opts := apply.Options{SpecOnly: []schema.GroupKind{gang.PodGroupKind}}
	if err := apply.NewWriter(env.Client, "test-restart-edit", opts).Ensure(ctx, o, pgWant()); err != nil {
		t.Fatal(err)
	}
	restarted = apply.NewWriter(env.Client, "test-restart-edit", opts)
	if err := restarted.Ensure(ctx, o, pgWant()); err != nil {
		t.Fatal(err)
	}
	pg := &schedulingv1beta1.PodGroup{}
	key := client.ObjectKey{Namespace: ns, Name: "restart-edit-pg"}
	if err := env.Client.Get(ctx, key, pg); err != nil {
		t.Fatal(err)
	}
	pg.Spec.MinMember = 1
	if err := env.Client.Update(ctx, pg); err != nil {
		t.Fatal(err)
	}
	if err := restarted.Ensure(ctx, o, pgWant()); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, key, pg); err != nil {
		t.Fatal(err)
	}
	if pg.Spec.MinMember != 4 {
		t.Fatalf("a PodGroup edited after the writer started was not put back: minMember %d", pg.Spec.MinMember)
	}
}

// A reference another party adds beside Loom's controller reference (a
// non-controller owner) is not Loom's to remove, and the apply leaves it
// there: it must not cost a write on every pass.
func TestEnsureIgnoresAnotherOwnerReference(t *testing.T) {
	ctx := context.Background()
	w := apply.NewWriter(env.Client, "test-extra-owner", apply.Options{})
	o, extra := owner(t, "extra-owner"), owner(t, "extra-other")
	if err := w.Ensure(ctx, o, child("extra-child", "1")); err != nil {
		t.Fatal(err)
	}
	cm := get(t, "extra-child")
	cm.OwnerReferences = append(cm.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: extra.Name, UID: extra.UID})
	if err := env.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := w.Ensure(ctx, o, child("extra-child", "1")); err != nil {
			t.Fatal(err)
		}
	}
	if n := testenv.WritesCounted(t, "ConfigMap", "test-extra-owner", "apply", "written"); n > 2 {
		t.Fatalf("an unchanged child with another party's owner reference was applied %v times, want at most 2 (create, one repair)", n)
	}
	if refs := get(t, "extra-child").OwnerReferences; len(refs) != 2 {
		t.Fatalf("owner references %+v, want Loom's and the other party's", refs)
	}
}

// An object of the child's name that Loom does not control is neither
// overwritten nor deleted.
func TestForeignObjectsAreLeftAlone(t *testing.T) {
	ctx := context.Background()
	w := apply.NewWriter(env.Client, "test-foreign", apply.Options{})
	o := owner(t, "foreign-owner")
	users := child("users-own", "theirs")
	if err := env.Client.Create(ctx, users); err != nil {
		t.Fatal(err)
	}
	err := w.Ensure(ctx, o, child("users-own", "ours"))
	if !apply.IsForeign(err) {
		t.Fatalf("Ensure over a user's object: got %v, want a ForeignError", err)
	}
	if err := w.Remove(ctx, o, child("users-own", "")); err != nil {
		t.Fatal(err)
	}
	if got := get(t, "users-own").Data["k"]; got != "theirs" {
		t.Fatalf("the user's object was changed: %q", got)
	}

	other := owner(t, "other-owner")
	if err := w.Ensure(ctx, other, child("others-child", "1")); err != nil {
		t.Fatal(err)
	}
	if err := w.Ensure(ctx, o, child("others-child", "2")); !apply.IsForeign(err) {
		t.Fatalf("Ensure over another owner's child: got %v, want a ForeignError", err)
	}
	if err := w.Remove(ctx, o, child("others-child", "")); err != nil {
		t.Fatal(err)
	}
	get(t, "others-child") // still there

	if err := w.Remove(ctx, other, child("others-child", "")); err != nil {
		t.Fatal(err)
	}
	err = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "others-child"}, &corev1.ConfigMap{})
	if !apierrors.IsNotFound(err) && get(t, "others-child").DeletionTimestamp == nil {
		t.Fatalf("the owner's own child was not removed: %v", err)
	}
}

// Status applies only the conditions the writer owns: another writer's
// condition survives a write from a copy that predates it, and an
// unchanged status costs no write.
func TestStatusOwnsOnlyItsConditions(t *testing.T) {
	ctx := context.Background()
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "writer-status"}}
	if err := env.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	stale := cp.DeepCopy()
	owners := apply.NewWriter(env.Client, "test-owner", apply.Options{Conditions: []string{"Ready"}})
	others := apply.NewWriter(env.Client, "test-other", apply.Options{Conditions: []string{"Other"}})

	other := gpuv1alpha1.ClusterPolicyStatus{Conditions: []metav1.Condition{cond("Other", "Seen")}}
	if _, err := others.Status(ctx, cp, &cp.Status, &other); err != nil {
		t.Fatal(err)
	}
	// The owner computes from a copy without Other, and even lists a
	// condition it does not own: neither removes nor claims Other.
	want := gpuv1alpha1.ClusterPolicyStatus{Conditions: []metav1.Condition{cond("Ready", "Rolled"), cond("Other", "Forged")}}
	if _, err := owners.Status(ctx, stale, &stale.Status, &want); err != nil {
		t.Fatal(err)
	}
	got := &gpuv1alpha1.ClusterPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), got); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, "Other"); c == nil || c.Reason != "Seen" {
		t.Fatalf("another writer's condition was lost or overwritten: %+v", got.Status.Conditions)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, "Ready"); c == nil || c.Reason != "Rolled" {
		t.Fatalf("the owner's condition was not written: %+v", got.Status.Conditions)
	}
	rv := got.ResourceVersion
	same := got.Status.DeepCopy()
	if _, err := owners.Status(ctx, got, &got.Status, same); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != rv {
		t.Fatal("an unchanged status was written")
	}

	// A guarded write from a stale copy fails instead of racing.
	if _, err := owners.Status(ctx, stale, &stale.Status, &want, apply.Guarded()); !apierrors.IsConflict(err) {
		t.Fatalf("guarded write from a stale copy: got %v, want a conflict", err)
	}
	if n := testenv.WritesCounted(t, "ClusterPolicy", "test-owner", "status", "skipped"); n != 1 {
		t.Fatalf("skipped status writes counted %v, want 1", n)
	}
}

func cond(t, reason string) metav1.Condition {
	return metav1.Condition{Type: t, Status: metav1.ConditionTrue, Reason: reason, Message: reason, LastTransitionTime: metav1.Now()}
}

// A kind whose generation moves with its status (Volcano's PodGroup has no
// status subresource) costs no write when only its status changed, and is
// still put back when its spec was edited.
func TestSpecOnlyKinds(t *testing.T) {
	ctx := context.Background()
	w := apply.NewWriter(env.Client, "test-speconly", apply.Options{SpecOnly: []schema.GroupKind{gang.PodGroupKind}})
	o := owner(t, "speconly-owner")
	want := func() *schedulingv1beta1.PodGroup {
		return &schedulingv1beta1.PodGroup{TypeMeta: metav1.TypeMeta{APIVersion: "scheduling.volcano.sh/v1beta1", Kind: "PodGroup"},
			ObjectMeta: metav1.ObjectMeta{Name: "speconly", Namespace: ns}, Spec: schedulingv1beta1.PodGroupSpec{MinMember: 4}}
	}
	if err := w.Ensure(ctx, o, want()); err != nil {
		t.Fatal(err)
	}
	pg := &schedulingv1beta1.PodGroup{}
	key := client.ObjectKey{Namespace: ns, Name: "speconly"}
	if err := env.Client.Get(ctx, key, pg); err != nil {
		t.Fatal(err)
	}
	pg.Status.Phase = schedulingv1beta1.PodGroupRunning
	if err := env.Client.Update(ctx, pg); err != nil {
		t.Fatal(err)
	}
	if err := w.Ensure(ctx, o, want()); err != nil {
		t.Fatal(err)
	}
	after := &schedulingv1beta1.PodGroup{}
	if err := env.Client.Get(ctx, key, after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != pg.ResourceVersion {
		t.Fatalf("a status-only change was read as an edit and re-applied (%s -> %s)", pg.ResourceVersion, after.ResourceVersion)
	}
	after.Spec.MinMember = 1
	if err := env.Client.Update(ctx, after); err != nil {
		t.Fatal(err)
	}
	if err := w.Ensure(ctx, o, want()); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, key, after); err != nil {
		t.Fatal(err)
	}
	if after.Spec.MinMember != 4 {
		t.Fatalf("a hand-edited spec was not put back: minMember %d", after.Spec.MinMember)
	}
}

// loomOnly is a client whose reads see only Loom's objects, as the
// manager's label-scoped cache does.
type loomOnly struct{ client.Client }

func (c loomOnly) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := c.Client.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if obj.GetLabels()[apply.LabelManagedBy] != apply.ManagedBy {
		return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
	}
	return nil
}

// With a cache that holds only Loom's objects, the live read before a
// create finds a user's object of the child's name, which is left alone.
func TestLiveReadFindsWhatTheCacheHides(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "live-owner")
	users := child("hidden-users", "theirs")
	if err := env.Client.Create(ctx, users); err != nil {
		t.Fatal(err)
	}
	w := apply.NewWriter(loomOnly{env.Client}, "test-live", apply.Options{Live: env.Client})
	if err := w.Ensure(ctx, o, child("hidden-users", "ours")); !apply.IsForeign(err) {
		t.Fatalf("Ensure over a user's object the cache hides: got %v, want a ForeignError", err)
	}
	if got := get(t, "hidden-users").Data["k"]; got != "theirs" {
		t.Fatalf("the user's object was changed: %q", got)
	}
	if err := w.Ensure(ctx, o, child("live-new", "ours")); err != nil {
		t.Fatalf("a free name: %v", err)
	}
}

// staleCache is a cache that has not seen any ConfigMap yet.
type staleCache struct{ client.Client }

func (c staleCache) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
}

// EnsureNew reports a create only when its call made the child: a cache
// behind an earlier create that finds the child made already is no
// second one.
func TestEnsureNewReportsOnlyItsOwnCreate(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "new-owner")
	w := apply.NewWriter(staleCache{env.Client}, "test-new", apply.Options{Live: env.Client})
	for i, want := range []bool{true, false} {
		created, err := w.EnsureNew(ctx, o, child("made-once", "v1"))
		if err != nil || created != want {
			t.Fatalf("call %d: created %v (%v), want %v", i+1, created, err, want)
		}
	}
}

// countingReader counts the reads that go around the cache.
type countingReader struct {
	client.Reader
	reads int
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads++
	return c.Reader.Get(ctx, key, obj, opts...)
}

// A child the cache does not show is created with a POST and no read
// around the cache; its first change later removes what the change drops,
// though the create, not an apply, set it.
func TestCreateReadsNothingAroundTheCache(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "post-owner")
	live := &countingReader{Reader: env.Client}
	w := apply.NewWriter(loomOnly{env.Client}, "test-post", apply.Options{Live: live})
	first := child("posted", "v1")
	first.Data["dropped"] = "soon"
	if err := w.Ensure(ctx, o, first); err != nil {
		t.Fatal(err)
	}
	if live.reads != 0 {
		t.Fatalf("creating a child read around the cache %d times", live.reads)
	}
	if got := testenv.WritesCounted(t, "ConfigMap", "test-post", "create", "written"); got != 1 {
		t.Fatalf("creates counted: %v, want 1", got)
	}
	if err := w.Ensure(ctx, o, child("posted", "v1")); err != nil {
		t.Fatal(err)
	}
	cm := get(t, "posted")
	if _, ok := cm.Data["dropped"]; ok || cm.Data["k"] != "v1" {
		t.Fatalf("after the change: data %v, want only k=v1 (the created field is handed to the apply and dropped)", cm.Data)
	}
	for _, f := range cm.ManagedFields {
		if f.Manager == "test-post" && f.Operation != metav1.ManagedFieldsOperationApply {
			t.Errorf("field owner test-post still holds fields by %s", f.Operation)
		}
	}
}

// A created child (a POST, its fields recorded as an update) that another
// party edits is put back with one write, the apply, whether the writer
// that created it sees the edit or a restarted one: the apply sets the
// fields the create set, so none is left for the create's record to keep,
// and there is nothing to hand over first. A later change of the desired
// state still drops what the create set and the change does not.
func TestRepairOfCreatedChildIsOneWrite(t *testing.T) {
	for _, restarted := range []bool{false, true} {
		name := fmt.Sprintf("posted-repair-%v", restarted)
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			o := owner(t, name+"-owner")
			fo := "test-" + name
			newWriter := func(c client.Client) *apply.Writer {
				return apply.NewWriter(loomOnly{c}, fo, apply.Options{Live: env.Client})
			}
			counter := testenv.CountWrites(env.Client)
			w := newWriter(counter)
			first := child(name, "v1")
			first.Data["dropped"] = "soon"
			if err := w.Ensure(ctx, o, first); err != nil {
				t.Fatal(err)
			}
			if restarted {
				w = newWriter(counter)
			}
			for i := range 2 {
				edited := get(t, name)
				edited.Data["k"] = fmt.Sprintf("edited by hand %d", i)
				if err := env.Client.Update(ctx, edited); err != nil {
					t.Fatal(err)
				}
				before := len(counter.Writes())
				want := child(name, "v1")
				want.Data["dropped"] = "soon"
				if err := w.Ensure(ctx, o, want); err != nil {
					t.Fatal(err)
				}
				if got := counter.Writes()[before:]; len(got) != 1 || !strings.HasPrefix(got[0], "apply ") {
					t.Fatalf("repair %d: writes %v, want one apply", i, got)
				}
				if got := get(t, name).Data["k"]; got != "v1" {
					t.Fatalf("repair %d: k = %q, want v1", i, got)
				}
			}
			if err := w.Ensure(ctx, o, child(name, "v2")); err != nil {
				t.Fatal(err)
			}
			if cm := get(t, name); len(cm.Data) != 1 || cm.Data["k"] != "v2" {
				t.Fatalf("after the change: data %v, want only k=v2", cm.Data)
			}
		})
	}
}
