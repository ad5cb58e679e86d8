package training

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// A queued job that can never run as written (more pods than
// --max-workload-pods, pod templates no pod may carry, pods the API server
// refuses) gets no Workload,
// as Kueue's jobframework makes none for a job that fails validation: one
// would queue, be admitted and hold quota for a gang that never starts.
// An admitted job edited into such a state loses its Workload, and the
// quota with it; mended, each job gets a Workload again.
func TestKueueNoWorkloadForAJobThatCannotRun(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-cannotrun")
	startManager(t, func(o *manager.Options) { o.MaxWorkloadPods = 3 })
	ctx := context.Background()
	patch := func(job *trainingv1alpha1.TrainingJob, p string) {
		t.Helper()
		if err := env.Client.Patch(ctx, getJob(t, job), client.RawPatch(types.MergePatchType, []byte(p))); err != nil {
			t.Fatal(err)
		}
	}
	noWorkload := func(job *trainingv1alpha1.TrainingJob, reason string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() error {
			got := getJob(t, job)
			if c := cond(got, trainingv1alpha1.ConditionReady); got.Status.State != trainingv1alpha1.StateHeld || c.Reason != reason {
				return fmt.Errorf("state %s, Ready %+v", got.Status.State, c)
			}
			if _, err := workloadOf(t, job); !apierrors.IsNotFound(err) {
				return fmt.Errorf("a job that cannot run has a Workload (%v)", err)
			}
			return nil
		})
		time.Sleep(2 * time.Second) // no pass makes one after all
		if _, err := workloadOf(t, job); !apierrors.IsNotFound(err) {
			t.Fatalf("a job that cannot run got a Workload (%v)", err)
		}
	}
	mended := func(job *trainingv1alpha1.TrainingJob, p string) {
		t.Helper()
		patch(job, `{"spec":{"runPolicy":{"suspend":true}}}`)
		patch(job, p)
		testenv.Eventually(t, 20*time.Second, func() error {
			if _, err := workloadOf(t, job); err != nil {
				return err
			}
			if got := getJob(t, job); cond(got, trainingv1alpha1.ConditionSuspended).Reason != ReasonQueuedInKueue {
				return fmt.Errorf("mended: state %s, Suspended %+v", got.Status.State, cond(got, trainingv1alpha1.ConditionSuspended))
			}
			return nil
		})
	}

	wide := newJob(ns, "wide", 5, 0, trainingv1alpha1.GangNone)
	wide.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	create(t, wide)
	noWorkload(wide, ReasonTooManyPods)
	mended(wide, `{"spec":{"runPolicy":{"suspend":false},"replicaSpecs":{"worker":{"replicas":1}}}}`)

	refused := newJob(ns, "refused", 1, 0, trainingv1alpha1.GangNone)
	refused.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	refused.Spec.ReplicaSpecs.Worker.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "big", ContainerPort: 70000}}
	create(t, refused)
	noWorkload(refused, ReasonInvalidSpec)
	mended(refused, `{"spec":{"runPolicy":{"suspend":false},"replicaSpecs":{"worker":{"template":{"spec":{"containers":[{"name":"pytorch","image":"busybox"}]}}}}}}`)

	edited := newJob(ns, "edited", 1, 0, trainingv1alpha1.GangNone)
	edited.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	create(t, edited)
	var u *unstructured.Unstructured
	testenv.Eventually(t, 20*time.Second, func() (err error) { u, err = workloadOf(t, edited); return err })
	admitWorkload(t, u)
	setPods(t, waitPods(t, edited, 2, 1), corev1.PodRunning, 0)
	waitState(t, edited, trainingv1alpha1.StateRunning)
	patch(edited, `{"spec":{"runPolicy":{"suspend":true}}}`)
	waitPods(t, edited, 0, 0)
	patch(edited, `{"spec":{"runPolicy":{"suspend":false},"replicaSpecs":{"worker":{"template":{"metadata":{"labels":{"team":"not a value"}}}}}}}`)
	noWorkload(edited, ReasonInvalidSpec)
	mended(edited, `{"spec":{"runPolicy":{"suspend":false},"replicaSpecs":{"worker":{"template":{"metadata":{"labels":{"team":"a"}}}}}}}`)
	if w, err := workloadOf(t, edited); err != nil || w.GetUID() == u.GetUID() {
		t.Fatalf("the mended job's Workload is the old one (%v)", err)
	}
}
