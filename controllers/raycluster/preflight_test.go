package raycluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// badTemplates are pod templates the API server refuses in a pod, which
// no check of Loom's or KubeRay's catches: field is what SpecValid names.
var badTemplates = []struct {
	name  string
	bad   func(*corev1.PodSpec)
	field string
}{
	{"env var name", func(s *corev1.PodSpec) {
		s.Containers[0].Env = append(s.Containers[0].Env, corev1.EnvVar{Name: "A=B", Value: "x"})
	}, ".spec.containers[0].env["},
	{"duplicate container name", func(s *corev1.PodSpec) {
		s.InitContainers = append(s.InitContainers, corev1.Container{Name: s.Containers[0].Name, Image: "busybox"})
	}, ".spec.initContainers[0].name"},
	{"containerPort 70000", func(s *corev1.PodSpec) {
		s.Containers[0].Ports = append(s.Containers[0].Ports, corev1.ContainerPort{Name: "big", ContainerPort: 70000})
	}, ".spec.containers[0].ports["},
	{"requests above limits", func(s *corev1.PodSpec) {
		s.Containers[0].Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}
	}, ".spec.containers[0].resources.requests"},
	{"volume name", func(s *corev1.PodSpec) {
		s.Volumes = append(s.Volumes, corev1.Volume{Name: "Bad_Name", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}, ".spec.volumes[0].name"},
	{"negative runAsUser", func(s *corev1.PodSpec) {
		s.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](-1)}
	}, ".spec.securityContext.runAsUser"},
}

// A cluster whose head or worker template the API server refuses (a dry
// run of one pod of each group, before anything is made) is held
// InvalidSpec naming the field, with no pod or Service made; mended, it
// runs.
func TestRefusedTemplateHoldsTheCluster(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	for i, tt := range badTemplates {
		t.Run(tt.name, func(t *testing.T) {
			rc := sample(t, "ray-cluster.sample.yaml", fmt.Sprintf("refused-%d", i))
			path, spec := "spec.workerGroupSpecs[0].template", &rc.Spec.WorkerGroupSpecs[0].Template.Spec
			if i%2 == 1 {
				path, spec = "spec.headGroupSpec.template", &rc.Spec.HeadGroupSpec.Template.Spec
			}
			tt.bad(spec)
			if err := env.Client.Create(ctx, rc); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 30*time.Second, func() error {
				c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionValid)
				if c == nil || c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, path+tt.field) {
					return fmt.Errorf("SpecValid %+v, want InvalidSpec naming %s", c, path+tt.field)
				}
				return nil
			})
			time.Sleep(time.Second) // passes after the hold make nothing either
			var svcs corev1.ServiceList
			if err := env.Client.List(ctx, &svcs, client.InNamespace(rc.Namespace)); err != nil {
				t.Fatal(err)
			}
			if pods := rayPods(t, rc); len(pods) != 0 || len(svcs.Items) != 0 {
				t.Fatalf("a held cluster made pods %v and %d Services", pods, len(svcs.Items))
			}
			if i > 0 {
				return
			}
			update(t, rc, func(rc *rayv1.RayCluster) {
				c := &rc.Spec.WorkerGroupSpecs[0].Template.Spec.Containers[0]
				c.Env = c.Env[:len(c.Env)-1]
			})
			testenv.Eventually(t, 30*time.Second, func() error {
				got := get(t, rc)
				if c := meta.FindStatusCondition(got.Status.Conditions, ConditionValid); c != nil {
					return fmt.Errorf("SpecValid %+v after the mend", c)
				}
				if pods := rayPods(t, rc); len(pods[headGroup]) != 1 || len(pods[rc.Spec.WorkerGroupSpecs[0].GroupName]) == 0 {
					return fmt.Errorf("pods %v", pods)
				}
				return nil
			})
		})
	}
}

// Identical clusters cost one dry run per template, not one per cluster:
// the answers are kept per namespace and pod shape, the cluster's name
// taken out.
func TestIdenticalClustersShareTheirDryRuns(t *testing.T) {
	ctx := context.Background()
	const ns, n = "preflight-shared", 5
	reg := &manager.Registry{}
	reg.Add("raycluster", Setup)
	opts := testenv.ManagerOptions(t)
	opts.LeaderElect, opts.GangScheduler, opts.WatchNamespaces = false, "none", []string{ns}
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	dryRuns := func() float64 { return testenv.CountedAll(t, "loom_preflight_dry_runs_total") }
	before := dryRuns()
	env.StartManager(t, opts, reg)
	for i := range n {
		rc := sample(t, "ray-cluster.sample.yaml", ns)
		rc.Name = fmt.Sprintf("shared-%d", i)
		if err := env.Client.Create(ctx, rc); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			if pods := rayPods(t, rc); len(pods) != 2 {
				return fmt.Errorf("pods %v", pods)
			}
			return nil
		})
	}
	// The head's template, the worker group's and the head Service: three.
	if got := dryRuns() - before; got != 3 {
		t.Fatalf("%d identical clusters cost %v dry runs, want 3", n, got)
	}
}

// badHeadServices are head Services (spec.headGroupSpec.headService, or
// serviceType) the API server refuses, which no check of Loom's or
// KubeRay's catches: field is what SpecValid names.
var badHeadServices = []struct {
	name  string
	bad   func(*rayv1.HeadGroupSpec)
	field string
}{
	{"port 0", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Ports = []corev1.ServicePort{{Name: "extra", Port: 0}}
	}, "spec.ports[0].port"},
	{"port 70000", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Ports = []corev1.ServicePort{{Name: "extra", Port: 70000}}
	}, "spec.ports[0].port"},
	{"port name used twice", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Ports = []corev1.ServicePort{{Name: "extra", Port: 9000}, {Name: "extra", Port: 9001}}
	}, "spec.ports[1].name"},
	{"port number of KubeRay's", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Ports = []corev1.ServicePort{{Name: "extra", Port: 8265}} // the dashboard's
	}, "Duplicate value"},
	{"protocol", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Ports = []corev1.ServicePort{{Name: "extra", Port: 9000, Protocol: "FOO"}}
	}, "spec.ports[0].protocol"},
	{"nodePort past 65535", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Type = corev1.ServiceTypeNodePort
		h.HeadService.Spec.Ports = []corev1.ServicePort{{Name: "extra", Port: 9000, NodePort: 70000}}
	}, "nodePort: Invalid value: 70000"},
	{"nodePort outside the server's range", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Type = corev1.ServiceTypeNodePort
		h.HeadService.Spec.Ports = []corev1.ServicePort{{Name: "extra", Port: 9000, NodePort: 20000}}
	}, "nodePort: Invalid value: 20000"},
	{"nodePort on a ClusterIP Service", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Ports = []corev1.ServicePort{{Name: "extra", Port: 9000, NodePort: 30080}}
	}, "spec.ports[0].nodePort"},
	{"targetPort name", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Ports = []corev1.ServicePort{{Name: "extra", Port: 9000, TargetPort: intstr.FromString("Bad_Name")}}
	}, "spec.ports[0].targetPort"},
	{"type", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Type = "Foo"
	}, "spec.type"},
	{"serviceType", func(h *rayv1.HeadGroupSpec) {
		h.HeadService, h.ServiceType = nil, "Foo"
	}, "spec.type"},
	{"clusterIP", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.ClusterIP = "not-an-ip"
	}, "spec.clusterIP"},
	{"loadBalancerSourceRanges", func(h *rayv1.HeadGroupSpec) {
		h.HeadService.Spec.Type = corev1.ServiceTypeLoadBalancer
		h.HeadService.Spec.LoadBalancerSourceRanges = []string{"not-a-cidr"}
	}, "LoadBalancerSourceRanges[0]"},
}

// A cluster whose head Service the API server refuses (a dry run before
// anything is made) is held InvalidSpec naming the field, with no pod or
// Service made; mended, it runs.
func TestRefusedHeadServiceHoldsTheCluster(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	for i, tt := range badHeadServices {
		t.Run(tt.name, func(t *testing.T) {
			rc := sample(t, "ray-cluster.sample.yaml", fmt.Sprintf("refused-svc-%d", i))
			rc.Spec.HeadGroupSpec.HeadService = &corev1.Service{}
			tt.bad(&rc.Spec.HeadGroupSpec)
			if err := env.Client.Create(ctx, rc); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 30*time.Second, func() error {
				c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionValid)
				if c == nil || c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, "the head Service") || !strings.Contains(c.Message, tt.field) {
					return fmt.Errorf("SpecValid %+v, want InvalidSpec naming the head Service's %s", c, tt.field)
				}
				return nil
			})
			time.Sleep(time.Second) // passes after the hold make nothing either
			var svcs corev1.ServiceList
			if err := env.Client.List(ctx, &svcs, client.InNamespace(rc.Namespace)); err != nil {
				t.Fatal(err)
			}
			if pods := rayPods(t, rc); len(pods) != 0 || len(svcs.Items) != 0 {
				t.Fatalf("a held cluster made pods %v and %d Services", pods, len(svcs.Items))
			}
			if i > 1 {
				return
			}
			update(t, rc, func(rc *rayv1.RayCluster) {
				rc.Spec.HeadGroupSpec.HeadService.Spec.Ports[0].Port = 9000
			})
			testenv.Eventually(t, 30*time.Second, func() error {
				got := get(t, rc)
				if c := meta.FindStatusCondition(got.Status.Conditions, ConditionValid); c != nil {
					return fmt.Errorf("SpecValid %+v after the mend", c)
				}
				if pods := rayPods(t, rc); len(pods[headGroup]) != 1 || len(pods[rc.Spec.WorkerGroupSpecs[0].GroupName]) == 0 {
					return fmt.Errorf("pods %v", pods)
				}
				return env.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name + "-head-svc"}, &corev1.Service{})
			})
		})
	}
}

// A running cluster whose head Service is edited into one the API server
// refuses (no dry run: the Service is there) is held InvalidSpec quoting
// the refusal from the pass after the refused write: no pod is created or
// deleted while it is; mended, it goes on.
func TestRefusedHeadServiceEditHoldsTheCluster(t *testing.T) {
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "refused-svc-edit")
	if err := env.Client.Create(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	group := rc.Spec.WorkerGroupSpecs[0].GroupName
	before := waitPods(t, rc, map[string]int{headGroup: 1, group: 1})
	update(t, rc, func(rc *rayv1.RayCluster) {
		rc.Spec.HeadGroupSpec.HeadService = &corev1.Service{Spec: corev1.ServiceSpec{
			Ports: []corev1.ServicePort{{Name: "extra", Port: 9000, TargetPort: intstr.FromString("Bad_Name")}}}}
		rc.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](3)
	})
	testenv.Eventually(t, 30*time.Second, func() error {
		c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionValid)
		if c == nil || c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, "the head Service") || !strings.Contains(c.Message, "targetPort: Invalid value: \"Bad_Name\"") {
			return fmt.Errorf("SpecValid %+v, want InvalidSpec naming the head Service's targetPort", c)
		}
		return nil
	})
	time.Sleep(time.Second)
	if pods := rayPods(t, rc); len(pods[headGroup]) != 1 || len(pods[group]) != 1 || pods[group][0].UID != before[group][0].UID {
		t.Fatalf("a held cluster changed its pods: %v", pods)
	}
	update(t, rc, func(rc *rayv1.RayCluster) {
		rc.Spec.HeadGroupSpec.HeadService.Spec.Ports[0].TargetPort = intstr.IntOrString{}
	})
	testenv.Eventually(t, 30*time.Second, func() error {
		if c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionValid); c != nil {
			return fmt.Errorf("SpecValid %+v after the mend", c)
		}
		return nil
	})
	waitPods(t, rc, map[string]int{headGroup: 1, group: 3})
}

// The dry runs are the creates the cluster will make, its owner reference
// included: under a policy that pods and Services be controlled by a
// RayCluster, the cluster gets its head Service and pods, instead of being
// held InvalidSpec on the dry runs' want of an owner.
func TestDryRunsCarryTheClustersOwnerReference(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "preflight-owned")
	ownedOnly(t, rc.Namespace)
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	waitPods(t, rc, map[string]int{"headgroup": 1, "workergroup": 1})
	testenv.Eventually(t, 30*time.Second, func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name + "-head-svc"}, &corev1.Service{})
	})
	if c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionValid); c != nil && c.Status != metav1.ConditionTrue {
		t.Fatalf("SpecValid %+v", c)
	}
}

// ownedOnly has the API server refuse, in namespace ns only, a pod or a
// Service that no RayCluster controls (a ValidatingAdmissionPolicy), once
// a dry run says the policy is in force.
func ownedOnly(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: ns + "-owned-only"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods", "services"}}}}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, r.kind == 'RayCluster' && has(r.controller) && r.controller)",
				Message:    "must be controlled by a RayCluster"}},
		}}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}}}}
	for _, o := range []client.Object{policy, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(ctx, binding)
		_ = env.Client.Delete(ctx, policy)
	})
	testenv.Eventually(t, 30*time.Second, func() error {
		probe := &corev1.Service{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: ns},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
		if err := env.Client.Create(ctx, probe, client.DryRunAll); !apierrors.IsInvalid(err) {
			return fmt.Errorf("the policy is not in force yet: %v", err)
		}
		return nil
	})
}
