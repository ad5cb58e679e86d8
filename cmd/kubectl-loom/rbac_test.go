package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/why"
)

// runAs runs kubectl loom with args as user (impersonated), as a user with
// only the rights RBAC gives that name.
func runAs(t *testing.T, user string, args ...string) (string, error) {
	t.Helper()
	return runAsOn(t, kubeconfig(t), user, args...)
}

// runAsOn is runAs against the API server of the kubeconfig file.
func runAsOn(t *testing.T, kubeconfig, user string, args ...string) (string, error) {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kc.AuthInfos["admin"].Impersonate = user
	path := filepath.Join(t.TempDir(), "kubeconfig-"+user)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd := newRootCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append([]string{"--kubeconfig", path}, args...))
	err = cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// A data scientist with rights in their own namespace only (Kubernetes'
// edit role bound there reads TrainingJobs and events, not the cluster's
// nodes and pods) still gets the answer for their waiting job; the live
// GPU picture, which needs the whole cluster, is said to be left out.
func TestWhyWaitingJobAsNamespaceUser(t *testing.T) {
	ctx := context.Background()
	const ns, user = "ml-team", "alice"
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "ml-edit", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{trainingv1alpha1.GroupVersion.Group}, Resources: []string{"trainingjobs"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events", "pods"}, Verbs: []string{"get", "list", "watch"}},
	}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ml-edit", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ml-edit"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if err := env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	tj := &trainingv1alpha1.TrainingJob{ObjectMeta: metav1.ObjectMeta{Name: "bert", Namespace: ns}}
	tj.Spec.ReplicaSpecs.Master = trainingv1alpha1.ReplicaSpec{Replicas: ptr.To[int32](1), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "train", Image: "pytorch", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}}}}}}}
	if err := env.Client.Create(ctx, tj); err != nil {
		t.Fatal(err)
	}
	msg := "0 of 1 pods placed; waiting for 8 nvidia.com/gpu to free up"
	now := metav1.NewTime(time.Now())
	tj.Status.State, tj.Status.ObservedGeneration = trainingv1alpha1.StatePending, tj.Generation
	tj.Status.Conditions = []metav1.Condition{
		{Type: trainingv1alpha1.ConditionCreated, Status: metav1.ConditionTrue, Reason: "Created", Message: "created", LastTransitionTime: now},
		{Type: trainingv1alpha1.ConditionScheduled, Status: metav1.ConditionFalse, Reason: why.ReasonNotEnoughGPUs, Message: msg, LastTransitionTime: now},
		{Type: trainingv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: why.ReasonNotEnoughGPUs, Message: msg, LastTransitionTime: now},
	}
	if err := env.Client.Status().Update(ctx, tj); err != nil {
		t.Fatal(err)
	}

	out, err := runAs(t, user, "why", "tj/bert", "-n", ns)
	if err != nil {
		t.Fatalf("why as a namespace user: %v\n%s", err, out)
	}
	if want := "trainingjob/bert: Pending (NotEnoughGPUs): " + msg; !strings.HasPrefix(out, want+"\n") {
		t.Errorf("answer\n got %q\nwant it to start with %q", out, want)
	}
	if !strings.Contains(out, "Also: GPUs now: not shown: nodes is forbidden") {
		t.Errorf("the answer does not say the live GPU picture is left out:\n%s", out)
	}

	// One who may read the job but not its namespace's events gets the
	// answer, and a line saying the events are left out.
	reader := role.DeepCopy()
	reader.ObjectMeta = metav1.ObjectMeta{Name: "tj-reader", Namespace: ns}
	reader.Rules = reader.Rules[:1]
	rb := binding.DeepCopy()
	rb.ObjectMeta = metav1.ObjectMeta{Name: "tj-reader", Namespace: ns}
	rb.RoleRef.Name, rb.Subjects[0].Name = "tj-reader", "bob"
	if err := env.Client.Create(ctx, reader); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, rb); err != nil {
		t.Fatal(err)
	}
	out, err = runAs(t, "bob", "why", "tj/bert", "-n", ns)
	if err != nil || !strings.HasPrefix(out, "trainingjob/bert: Pending (NotEnoughGPUs): ") ||
		!strings.Contains(out, "Also: Warning events: not shown: events is forbidden") {
		t.Errorf("why without rights on events: %v\n%s", err, out)
	}
}

// A Forbidden error names the one right the API server refused; the
// plugin adds every right the command needs.
func TestForbiddenSaysWhatTheCommandNeeds(t *testing.T) {
	for _, args := range [][]string{{"gpus"}, {"upgrades"}, {"why", "cp/default"}} {
		_, err := runAs(t, "nobody", args...)
		if err == nil || !strings.Contains(err.Error(), "is forbidden") || !strings.Contains(err.Error(), "kubectl loom "+args[0]+" needs "+rights[args[0]]) {
			t.Errorf("kubectl loom %v as a user without rights: %v", args, err)
		}
	}
}
