package raycluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
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
	dryRuns := func() float64 {
		var sum float64
		for _, r := range []string{"admitted", "invalid", "unknown"} {
			sum += testenv.Counted(t, "loom_preflight_dry_runs_total", map[string]string{"result": r})
		}
		return sum
	}
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
	// The head's template and the worker group's: two.
	if got := dryRuns() - before; got != 2 {
		t.Fatalf("%d identical clusters cost %v dry runs, want 2", n, got)
	}
}
