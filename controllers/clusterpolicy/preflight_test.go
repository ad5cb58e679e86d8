package clusterpolicy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/testenv"
)

// A policy whose spec the API server admits but whose operands it would
// not (a value it refuses in a pod, a node selector key) makes nothing:
// Ready=False, InvalidSpec, naming the field, and no ServiceAccount, RBAC,
// ConfigMap or DaemonSet of any operand, instead of the operands before
// the refused one made and the rest failing on every pass. Fixed, it
// makes the stack.
func TestInvalidSpecMakesNothing(t *testing.T) {
	ctx := context.Background()
	const namespace = "loom-invalid"
	if err := env.CreateNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	// The policy in force is the oldest: this test's must be the only one.
	if err := env.Client.DeleteAllOf(ctx, &gpuv1alpha1.ClusterPolicy{}); err != nil {
		t.Fatal(err)
	}
	r := New(env.Client, env.Client, namespace)
	tests := []struct{ name, spec, want string }{
		{"toleration operator", `{daemonsets: {tolerations: [{key: dedicated, operator: Sometimes, effect: NoSchedule}]}}`,
			"spec.tolerations[1].operator"},
		{"requests above limits", `{devicePlugin: {resources: {requests: {cpu: "2"}, limits: {cpu: "1"}}}}`,
			"DaemonSet loom-device-plugin: pod.spec.containers[0].resources.requests"},
		{"env var name", `{dcgmExporter: {env: [{name: "A=B", value: x}]}}`,
			"DaemonSet loom-dcgm-exporter: pod.spec.containers[0].env[5].name"},
		{"node selector key", `{toolkit: {nodeSelector: {"bad key": "x"}}}`,
			"spec.toolkit.nodeSelector[bad key]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := policy(t, "invalid", tt.spec)
			if err := env.Client.Create(ctx, u); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = env.Client.Delete(ctx, u) }()
			if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: "invalid"}}); err != nil {
				t.Fatal(err)
			}
			cp := getPolicy(t, "invalid")
			c := meta.FindStatusCondition(cp.Status.Conditions, "Ready")
			if c == nil || c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, tt.want) {
				t.Errorf("Ready %+v, want InvalidSpec naming %q", c, tt.want)
			}
			for _, list := range []client.ObjectList{&appsv1.DaemonSetList{}, &corev1.ServiceAccountList{}, &corev1.ConfigMapList{}} {
				if err := env.Client.List(ctx, list, client.InNamespace(namespace)); err != nil {
					t.Fatal(err)
				}
				if n := meta.LenList(list); n > 0 {
					t.Errorf("%T: %d made for an invalid spec", list, n)
				}
			}
		})
	}
	u := policy(t, "invalid", `{devicePlugin: {env: [{name: EXTRA, value: x}]}}`)
	if err := env.Client.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Client.Delete(ctx, u) }()
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: "invalid"}}); err != nil {
		// The RuntimeClass of an earlier test's policy, which no garbage
		// collector removes here.
		t.Logf("a valid spec: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "loom-device-plugin"}, &appsv1.DaemonSet{}); err != nil {
		t.Errorf("a valid spec's device plugin: %v", err)
	}
}

// The operands' dry-run pods are controlled by their DaemonSet, as the
// DaemonSet controller makes them: under an admission policy that pods
// have a controller (no bare pods), a valid policy makes its stack,
// instead of being held InvalidSpec on its dry runs' want of an owner.
func TestDryRunPodsAreControlledByTheirDaemonSet(t *testing.T) {
	ctx := context.Background()
	const namespace = "loom-owned-pods"
	if err := env.CreateNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.DeleteAllOf(ctx, &gpuv1alpha1.ClusterPolicy{}); err != nil {
		t.Fatal(err)
	}
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: namespace + "-pods-controlled"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller)",
				Message:    "a pod must have a controller"}},
		}}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: vap.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: vap.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: namespace}}}}}
	for _, o := range []client.Object{vap, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = env.Client.Delete(ctx, o) }()
	}
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: namespace},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	testenv.Eventually(t, 30*time.Second, func() error {
		if err := env.Client.Create(ctx, probe.DeepCopy(), client.DryRunAll); !apierrors.IsInvalid(err) {
			return fmt.Errorf("the admission policy is not in force yet: %v", err)
		}
		return nil
	})
	r := New(env.Client, env.Client, namespace)
	u := policy(t, "owned-pods", `{}`)
	if err := env.Client.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Client.Delete(ctx, u) }()
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: "owned-pods"}}); err != nil {
		t.Logf("reconcile: %v", err) // a RuntimeClass of an earlier test's policy
	}
	if c := meta.FindStatusCondition(getPolicy(t, "owned-pods").Status.Conditions, "Ready"); c != nil && c.Reason == ReasonInvalidSpec {
		t.Fatalf("held: %s", c.Message)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "loom-device-plugin"}, &appsv1.DaemonSet{}); err != nil {
		t.Errorf("the device plugin's DaemonSet: %v", err)
	}
}
