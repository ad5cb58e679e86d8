package training

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// installLocalQueueCRD installs a stand-in for Kueue's LocalQueue CRD.
func installLocalQueueCRD(t *testing.T) {
	t.Helper()
	installKueueCRD(t, "localqueues", "LocalQueue", apiextensionsv1.NamespaceScoped)
}

// localQueue creates a LocalQueue.
func localQueue(t *testing.T, ns, name string) {
	t.Helper()
	lq := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"clusterQueue": "cluster"}}}
	lq.SetGroupVersionKind(kueue.LocalQueueGVK)
	lq.SetNamespace(ns)
	lq.SetName(name)
	create(t, lq)
}

// A job created without a queue label in a namespace that has a LocalQueue
// named default is labelled with it and queued through it, as Kueue's
// webhook labels its own jobs (LocalQueueDefaulting, locked on in Kueue
// v0.17): a platform whose jobs all go through Kueue is not bypassed by
// one that forgot the label. A job naming its LocalQueue keeps it, and one
// in a namespace without a default LocalQueue runs outside Kueue.
func TestKueueDefaultLocalQueue(t *testing.T) {
	installWorkloadCRD(t)
	installLocalQueueCRD(t)
	withDefault := namespace(t, "kueue-default-lq")
	without := namespace(t, "kueue-no-default-lq")
	localQueue(t, withDefault, kueue.DefaultLocalQueue)
	localQueue(t, withDefault, "team")
	localQueue(t, without, "team")
	startManager(t)

	unlabelled := newJob(withDefault, "unlabelled", 1, 0, trainingv1alpha1.GangNone)
	named := newJob(withDefault, "named", 1, 0, trainingv1alpha1.GangNone)
	named.Labels = map[string]string{kueue.QueueLabel: "team"}
	elsewhere := newJob(without, "elsewhere", 1, 0, trainingv1alpha1.GangNone)
	for _, job := range []*trainingv1alpha1.TrainingJob{unlabelled, named, elsewhere} {
		create(t, job)
	}
	for job, queue := range map[*trainingv1alpha1.TrainingJob]string{unlabelled: kueue.DefaultLocalQueue, named: "team"} {
		testenv.Eventually(t, 20*time.Second, func() error {
			if q := getJob(t, job).Labels[kueue.QueueLabel]; q != queue {
				return fmt.Errorf("%s: queue label %q, want %q", job.Name, q, queue)
			}
			wl, err := workloadOf(t, job)
			if err != nil {
				return err
			}
			if q, _, _ := unstructured.NestedString(wl.Object, "spec", "queueName"); q != queue {
				return fmt.Errorf("%s: Workload in LocalQueue %q, want %q", job.Name, q, queue)
			}
			return nil
		})
		waitState(t, job, trainingv1alpha1.StateSuspended)
		if n := len(jobPods(t, job)); n != 0 {
			t.Fatalf("%s, waiting for Kueue, has %d pods", job.Name, n)
		}
	}
	waitPods(t, elsewhere, 2, 0)
	if q, ok := getJob(t, elsewhere).Labels[kueue.QueueLabel]; ok {
		t.Fatalf("a job in a namespace without a default LocalQueue was labelled %q", q)
	}
}

// With --kueue-manage-jobs-without-queue-name, a job that names no
// LocalQueue is held without pods or Workload (Suspended, reason
// QueueNameMissing, Stalled: a person must name one), as Kueue holds its
// own jobs under manageJobsWithoutQueueName, instead of running outside
// Kueue; labelled, it is queued.
func TestKueueManageJobsWithoutQueueName(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-unnamed")
	startManager(t, func(o *manager.Options) { o.KueueManageJobsWithoutQueueName = true })
	job := newJob(ns, "unnamed", 1, 0, trainingv1alpha1.GangNone)
	create(t, job)
	got := waitState(t, job, trainingv1alpha1.StateSuspended)
	if c := cond(got, trainingv1alpha1.ConditionSuspended); c.Reason != ReasonQueueNameMissing {
		t.Fatalf("Suspended %s: %s", c.Reason, c.Message)
	}
	if c := cond(got, trainingv1alpha1.ConditionStalled); c.Status != metav1.ConditionTrue {
		t.Fatalf("Stalled %s %s: %s", c.Status, c.Reason, c.Message)
	}
	time.Sleep(time.Second)
	if n := len(jobPods(t, job)); n != 0 {
		t.Fatalf("the job naming no LocalQueue has %d pods", n)
	}
	if _, err := workloadOf(t, job); !apierrors.IsNotFound(err) {
		t.Fatalf("the job naming no LocalQueue has a Workload (%v)", err)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"team"}}}`, kueue.QueueLabel)
	if err := env.Client.Patch(context.Background(), got, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if c := cond(getJob(t, job), trainingv1alpha1.ConditionSuspended); c.Reason != ReasonQueuedInKueue {
			return fmt.Errorf("labelled: Suspended %s: %s", c.Reason, c.Message)
		}
		_, err := workloadOf(t, job)
		return err
	})
}
