package training

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// A job whose master or worker template the API server refuses in a pod
// (a dry run of one pod of each role, before anything is made) is held
// InvalidSpec naming the field, with no pod or Service made; mended (while
// suspended, as its templates change), it runs.
func TestRefusedTemplateHoldsTheJob(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		bad   func(*corev1.PodSpec)
		field string
	}{
		{"env var name", func(s *corev1.PodSpec) { s.Containers[0].Env = []corev1.EnvVar{{Name: "A=B", Value: "x"}} }, ".spec.containers[0].env[0].name"},
		{"duplicate container name", func(s *corev1.PodSpec) {
			s.InitContainers = []corev1.Container{{Name: s.Containers[0].Name, Image: "busybox"}}
		}, ".spec.initContainers[0].name"},
		{"containerPort 70000", func(s *corev1.PodSpec) {
			s.Containers[0].Ports = []corev1.ContainerPort{{Name: "big", ContainerPort: 70000}}
		}, ".spec.containers[0].ports[0].containerPort"},
		{"requests above limits", func(s *corev1.PodSpec) {
			s.Containers[0].Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}
		}, ".spec.containers[0].resources.requests"},
		{"volume name", func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "Bad_Name", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		}, ".spec.volumes[0].name"},
		{"negative runAsUser", func(s *corev1.PodSpec) {
			s.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr[int64](-1)}
		}, ".spec.securityContext.runAsUser"},
	}
	ns := namespace(t, "refused")
	startManager(t)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := newJob(ns, fmt.Sprintf("refused-%d", i), 2, 0, trainingv1alpha1.GangNone)
			path, spec := "spec.replicaSpecs.worker.template", &job.Spec.ReplicaSpecs.Worker.Template.Spec
			if i%2 == 1 {
				path, spec = "spec.replicaSpecs.master.template", &job.Spec.ReplicaSpecs.Master.Template.Spec
			}
			tt.bad(spec)
			create(t, job)
			got := waitState(t, job, trainingv1alpha1.StateHeld)
			for _, typ := range []string{trainingv1alpha1.ConditionReady, trainingv1alpha1.ConditionCreated} {
				if c := cond(got, typ); c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, path+tt.field) {
					t.Fatalf("%s = %+v, want InvalidSpec naming %s", typ, c, path+tt.field)
				}
			}
			time.Sleep(time.Second) // passes after the hold make nothing either
			if pods := jobPods(t, job); len(pods) != 0 {
				t.Fatalf("a held job created pods %v", names(pods))
			}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), &corev1.Service{}); !apierrors.IsNotFound(err) {
				t.Fatalf("a held job's Service: %v", err)
			}
			if i > 0 {
				return
			}
			edit := func(f func(*trainingv1alpha1.TrainingJob)) {
				testenv.Eventually(t, 10*time.Second, func() error {
					j := getJob(t, job)
					f(j)
					return env.Client.Update(ctx, j)
				})
			}
			edit(func(j *trainingv1alpha1.TrainingJob) { j.Spec.RunPolicy.Suspend = true })
			// Seen suspended (a new attempt then), not only the resumed
			// spec after it.
			waitState(t, job, trainingv1alpha1.StateSuspended)
			edit(func(j *trainingv1alpha1.TrainingJob) {
				j.Spec.RunPolicy.Suspend = false
				j.Spec.ReplicaSpecs.Worker.Template.Spec.Containers[0].Env = nil
			})
			waitPods(t, job, 3, 1)
		})
	}
}

// Identical jobs cost one dry run per template, not one per job: the
// answers are kept per namespace and pod shape, the job's name taken out.
func TestIdenticalJobsShareTheirDryRuns(t *testing.T) {
	const n = 5
	ns := namespace(t, "preflight-shared")
	dryRuns := func() float64 { return testenv.CountedAll(t, "loom_preflight_dry_runs_total") }
	before := dryRuns()
	startManager(t, func(o *manager.Options) { o.WatchNamespaces = []string{ns} })
	for i := range n {
		job := newJob(ns, fmt.Sprintf("shared-%d", i), 2, 0, trainingv1alpha1.GangNone)
		create(t, job)
		waitPods(t, job, 3, 0)
	}
	// The master's template and the workers': two.
	if got := dryRuns() - before; got != 2 {
		t.Fatalf("%d identical jobs cost %v dry runs, want 2", n, got)
	}
}
