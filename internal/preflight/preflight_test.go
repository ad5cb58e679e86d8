package preflight

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// pod is a pod built for owner: the owner's name in its labels, env and
// hostname, as the controllers build them.
func pod(ns, owner string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: owner + "-worker-0", Namespace: ns, Labels: map[string]string{"job": owner}},
		Spec: corev1.PodSpec{Hostname: owner + "-worker-0", Containers: []corev1.Container{{Name: "c", Image: "x",
			Env: []corev1.EnvVar{{Name: "MASTER_ADDR", Value: owner + "-master-0." + owner}}}}},
	}
}

// Only an Invalid answer refuses the pod, quoting its causes under the
// template's path; any other error says nothing. Each answer is asked once
// for every owner of the same template in a namespace; a cancelled
// pass's is not kept.
func TestRefused(t *testing.T) {
	invalid := apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p", field.ErrorList{
		field.Invalid(field.NewPath("spec", "containers").Index(0).Child("ports").Index(0).Child("containerPort"), 70000, "must be between 1 and 65535, inclusive")})
	tests := []struct {
		name   string
		answer error
		want   string
	}{
		{"admitted", nil, ""},
		{"invalid", invalid, `spec.workerGroupSpecs[0].template.spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive`},
		{"invalid, naming no field (a ValidatingAdmissionPolicy)", &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422,
			Reason: metav1.StatusReasonInvalid, Message: "pods is invalid: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no",
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Message: "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no"}}}}},
			`spec.workerGroupSpecs[0].template.spec: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no`},
		{"forbidden by quota", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("exceeded quota")), ""},
		{"a webhook refuses dry runs", apierrors.NewBadRequest("admission webhook does not support dry run"), ""},
		{"timeout", apierrors.NewTimeoutError("slow", 1), ""},
		{"already exists", apierrors.NewAlreadyExists(schema.GroupResource{Resource: "pods"}, "p"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
				Create: func(_ context.Context, _ client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					calls++
					o := &client.CreateOptions{}
					o.ApplyOptions(opts)
					if len(o.DryRun) != 1 || o.DryRun[0] != metav1.DryRunAll || obj.GetName() != "" || obj.GetGenerateName() == "" {
						t.Fatalf("not a dry run under a generated name: %+v %q %q", o, obj.GetName(), obj.GetGenerateName())
					}
					return tt.answer
				}}).Build()
			ns := "ns-" + strings.ReplaceAll(tt.name, " ", "-")
			for _, owner := range []string{"job-a", "job-b", "job-c"} {
				if got := Refused(context.Background(), c, owner, "spec.workerGroupSpecs[0].template", pod(ns, owner)); got != tt.want {
					t.Fatalf("%s: %q, want %q", owner, got, tt.want)
				}
			}
			if calls != 1 {
				t.Fatalf("three owners of one template cost %d dry runs, want 1", calls)
			}
			other := pod(ns, "job-a")
			other.Spec.Containers[0].Image = "y"
			Refused(context.Background(), c, "job-a", "spec", other)
			Refused(context.Background(), c, "job-a", "spec", pod("other-"+ns, "job-a"))
			if calls != 3 {
				t.Fatalf("another template and another namespace cost %d dry runs in all, want 3", calls)
			}
		})
	}
	t.Run("cancelled", func(t *testing.T) {
		calls := 0
		c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, _ client.WithWatch, _ client.Object, _ ...client.CreateOption) error {
				calls++
				return ctx.Err()
			}}).Build()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		Refused(ctx, c, "j", "spec", pod("cancelled", "j"))
		Refused(context.Background(), c, "j", "spec", pod("cancelled", "j"))
		if calls != 2 {
			t.Fatalf("a cancelled pass's answer was kept: %d dry runs, want 2", calls)
		}
	})
}

// A real write refused as invalid is kept as the answer for its shape
// (Known, and Refused without a dry run); any other error is not; Known
// never asks.
func TestRecordAndKnown(t *testing.T) {
	invalid := apierrors.NewInvalid(schema.GroupKind{Kind: "Service"}, "s", field.ErrorList{
		field.Invalid(field.NewPath("spec", "ports").Index(0).Child("nodePort"), 20000, "provided port is not in the valid range")})
	calls := 0
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			calls++
			return nil
		}}).Build()
	svc := func(ns, owner string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: owner + "-head-svc", Namespace: ns, Labels: map[string]string{"ray.io/cluster": owner}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{Port: 9000, NodePort: 20000}}}}
	}
	if got := Known("ray-a", "", svc("record", "ray-a")); got != "" || calls != 0 {
		t.Fatalf("Known before any answer: %q after %d dry runs", got, calls)
	}
	Record("ray-a", svc("record", "ray-a"), apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "s", errors.New("quota")))
	if got := Known("ray-a", "", svc("record", "ray-a")); got != "" {
		t.Fatalf("a Forbidden write was kept: %q", got)
	}
	Record("ray-a", svc("record", "ray-a"), fmt.Errorf("applying Service: %w", invalid))
	want := `spec.ports[0].nodePort: Invalid value: 20000: provided port is not in the valid range`
	if got := Known("ray-b", "", svc("record", "ray-b")); got != want {
		t.Fatalf("Known for another owner of the shape: %q, want %q", got, want)
	}
	if got := Refused(context.Background(), c, "ray-b", "x", svc("record", "ray-b")); got != "x."+want || calls != 0 {
		t.Fatalf("Refused: %q after %d dry runs, want %q and none", got, calls, "x."+want)
	}
	if got := Known("ray-a", "", svc("other", "ray-a")); got != "" {
		t.Fatalf("Known in another namespace: %q", got)
	}
}

// The dry run is the create the controller makes, its owner references
// included (a policy may read them), and costs one dry run for owners of
// one shape whatever their UIDs.
func TestTheDryRunCarriesTheOwner(t *testing.T) {
	var sent []metav1.OwnerReference
	calls := 0
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			calls++
			sent = obj.GetOwnerReferences()
			return nil
		}}).Build()
	for i, owner := range []string{"own-a", "own-b"} {
		p := pod("owned", owner)
		ref := metav1.OwnerReference{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: owner, UID: types.UID(fmt.Sprintf("uid-%d", i)), Controller: ptr.To(true)}
		p.OwnerReferences = []metav1.OwnerReference{ref}
		Refused(context.Background(), c, owner, "spec", p)
		if i == 0 && !reflect.DeepEqual(sent, p.OwnerReferences) {
			t.Fatalf("the dry run's owner references: %+v, want %+v", sent, ref)
		}
	}
	if calls != 1 {
		t.Fatalf("two owners of one template cost %d dry runs, want 1", calls)
	}
}

// An answer names the object as the controller names it (the name it was
// given, or its generateName and <random>), not by the dry run's
// generated name, and a UID only the dry run had as <uid>. An answer that
// quotes its owner's name is asked again for another owner, whose own
// name it then quotes; one that does not is shared.
func TestRefusedNamesTheObjectAsMade(t *testing.T) {
	calls := 0
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			calls++
			name := obj.GetGenerateName() + "x7k2p"
			return apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, name, field.ErrorList{
				field.Invalid(field.NewPath("spec", "hostname"), obj.(*corev1.Pod).Spec.Hostname, "must be '"+name+"' of uid 0be7be01-6433-4790-b0c3-a957484b5a14")})
		}}).Build()
	named := func(owner string) *corev1.Pod { return pod("names", owner) }
	generated := func(owner string) *corev1.Pod {
		p := pod("names", owner)
		p.Name, p.GenerateName = "", owner+"-head-"
		return p
	}
	tests := []struct {
		owner string
		pod   func(string) *corev1.Pod
		want  string
		calls int
	}{
		{"job-a", named, `spec.hostname: Invalid value: "job-a-worker-0": must be 'job-a-worker-0' of uid <uid>`, 1},
		{"job-a", named, `spec.hostname: Invalid value: "job-a-worker-0": must be 'job-a-worker-0' of uid <uid>`, 1},
		{"job-b", named, `spec.hostname: Invalid value: "job-b-worker-0": must be 'job-b-worker-0' of uid <uid>`, 2},
		{"job-c", generated, `spec.hostname: Invalid value: "job-c-worker-0": must be 'job-c-head-<random>' of uid <uid>`, 3},
	}
	for _, tt := range tests {
		if got := Refused(context.Background(), c, tt.owner, "", tt.pod(tt.owner)); got != tt.want || calls != tt.calls {
			t.Fatalf("%s: %q after %d dry runs, want %q after %d", tt.owner, got, calls, tt.want, tt.calls)
		}
	}
}
