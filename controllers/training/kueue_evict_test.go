package training

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/testenv"
)

// What Kueue (or a person) does to a running job's Workload stops the
// gang: an eviction deletes every pod, holds the job (Suspended,
// EvictedByKueue, quoting Kueue) and, once no pod is left, gives the quota
// back (no admission, QuotaReserved False, Requeued True after a
// preemption) for Kueue to admit it again; a Workload deleted by hand
// holds the job the same way (Kueue's jobframework stops a job whose
// Workload is gone, or being deleted) and a new Workload is queued in its
// place once the old one is gone.
func TestKueueEvictionAndDeletedWorkloadStopTheGang(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-evict")
	startManager(t)
	ctx := context.Background()
	workload := func(job *trainingv1alpha1.TrainingJob) (*kueue.Workload, *unstructured.Unstructured, error) {
		return parsedWorkloadOf(t, job)
	}
	now := metav1.Now().UTC().Format(time.RFC3339)
	run := func(name string) (*trainingv1alpha1.TrainingJob, *unstructured.Unstructured) {
		job := newJob(ns, name, 1, 0, trainingv1alpha1.GangNone)
		job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
		create(t, job)
		var u *unstructured.Unstructured
		testenv.Eventually(t, 20*time.Second, func() (err error) { _, u, err = workload(job); return err })
		admitWorkload(t, u)
		setPods(t, waitPods(t, job, 2, 1), corev1.PodRunning, 0)
		waitState(t, job, trainingv1alpha1.StateRunning)
		_, u, err := workload(job)
		if err != nil {
			t.Fatal(err)
		}
		return job, u
	}
	held := func(job *trainingv1alpha1.TrainingJob, reason, msg string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() error {
			if n := len(jobPods(t, job)); n != 0 {
				return fmt.Errorf("%d pods left", n)
			}
			got := getJob(t, job)
			c := cond(got, trainingv1alpha1.ConditionSuspended)
			if got.Status.State != trainingv1alpha1.StateSuspended || c.Status != metav1.ConditionTrue || c.Reason != reason || !strings.Contains(c.Message, msg) {
				return fmt.Errorf("state %s, Suspended %+v", got.Status.State, c)
			}
			if r := cond(got, trainingv1alpha1.ConditionRunning); r.Status != metav1.ConditionFalse {
				return fmt.Errorf("Running %+v", r)
			}
			if n := got.Status.ReplicaStatuses.Master.Active + got.Status.ReplicaStatuses.Worker.Active; n != 0 {
				return fmt.Errorf("%d active replicas in the status", n)
			}
			return nil
		})
	}

	evicted, u := run("evicted")
	later := metav1.Now().UTC().Format(time.RFC3339)
	statusPatch(t, u, fmt.Sprintf(`{"status":{"conditions":[`+
		`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
		`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q},`+
		`{"type":"Evicted","status":"True","reason":"Preempted","message":"Preempted to accommodate a workload (UID: x) due to prioritization in the ClusterQueue","lastTransitionTime":%q}]}}`,
		now, now, later))
	held(evicted, ReasonEvictedByKueue, "Preempted to accommodate a workload")
	testenv.Eventually(t, 20*time.Second, func() error {
		w, _, err := workload(evicted)
		if err != nil {
			return err
		}
		if w.QuotaReserved() || w.Status.Admission != nil {
			return fmt.Errorf("the evicted Workload still holds its quota: %+v", w.Status)
		}
		if c := w.Cond("Requeued"); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("Requeued %+v, want True after a preemption", c)
		}
		return nil
	})

	deleted, u := run("deleted")
	if err := env.Client.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	held(deleted, ReasonQueuedInKueue, "waiting for Kueue")
	testenv.Eventually(t, 20*time.Second, func() error {
		w, _, err := workload(deleted)
		if err != nil {
			return err
		}
		if w.UID == u.GetUID() || w.QuotaReserved() {
			return fmt.Errorf("no new Workload queued in place of the deleted one (UID %s, quota reserved %v)", w.UID, w.QuotaReserved())
		}
		return nil
	})

	// Another party's finalizer keeps the deleted Workload, admitted.
	lingering, u := run("lingering")
	if err := env.Client.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":["example.com/hold"]}}`))); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	held(lingering, ReasonQueuedInKueue, "is being deleted")
	if err := env.Client.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		w, _, err := workload(lingering)
		if err != nil {
			return err
		}
		if w.UID == u.GetUID() {
			return fmt.Errorf("no new Workload in place of the deleted one")
		}
		return nil
	})
	held(lingering, ReasonQueuedInKueue, "waiting for Kueue")
}

// The Suspended condition of a job Kueue holds says what holds it now,
// not what held it first: Kueue's message changes while the job waits (the
// quota it lacks, a LocalQueue created or missing), and Ready and
// Scheduled, which carry the same words, follow it.
func TestKueueSuspendedFollowsKueuesWord(t *testing.T) {
	job := newJob("ns", "waiting", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "parked"}
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wl"}, Spec: kueue.WorkloadSpec{QueueName: "parked"}}
	word := func(msg string) {
		wl.Status.Conditions = []metav1.Condition{{Type: kueue.CondQuotaReserved, Status: metav1.ConditionFalse, Reason: "Inadmissible", Message: msg}}
	}
	now := time.Now()
	pass := func() trainingv1alpha1.TrainingJobStatus {
		obs := observed{now: now, kueue: kueueObs{queued: true, served: true, wl: wl}}
		st := decide(job, obs, trainingv1alpha1.GangNone).status
		job.Status = st
		now = now.Add(time.Second)
		return st
	}
	word("LocalQueue parked doesn't exist")
	st := pass()
	if c := cond(&trainingv1alpha1.TrainingJob{Status: st}, trainingv1alpha1.ConditionSuspended); !strings.Contains(c.Message, "LocalQueue parked doesn't exist") {
		t.Fatalf("Suspended %q does not say the LocalQueue is missing", c.Message)
	}
	word("couldn't assign flavors to pod set master: insufficient unused quota for cpu in flavor default, 1 more needed")
	st = pass()
	for _, ct := range []string{trainingv1alpha1.ConditionSuspended, trainingv1alpha1.ConditionReady} {
		if c := cond(&trainingv1alpha1.TrainingJob{Status: st}, ct); !strings.Contains(c.Message, "insufficient unused quota") || c.Reason != ReasonQueuedInKueue {
			t.Errorf("%s = %s %q, want Kueue's new word", ct, c.Reason, c.Message)
		}
	}
}

// The queue label edited on a running job: added, the job is Kueue's from
// then on (Kueue's webhook refuses that edit on its own running jobs; Loom
// has none, and does as Kueue's reconciler does with a running job that has
// no admitted Workload): the gang stops, a Workload is queued, and the job
// runs again, as a new attempt, once admitted. Removed from an admitted
// running job, the Workload goes and the gang runs on outside Kueue.
func TestKueueLabelOnARunningJob(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-running")
	startManager(t)
	workload := func(job *trainingv1alpha1.TrainingJob) (*unstructured.Unstructured, error) { return workloadOf(t, job) }
	label := func(job *trainingv1alpha1.TrainingJob, value string) { setQueueLabel(t, job, value) }
	job := newJob(ns, "relabelled", 1, 0, trainingv1alpha1.GangNone)
	create(t, job)
	setPods(t, waitPods(t, job, 2, 0), corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)

	label(job, `"team-a"`)
	waitPods(t, job, 0, 0)
	got := waitState(t, job, trainingv1alpha1.StateSuspended)
	if c := cond(got, trainingv1alpha1.ConditionSuspended); c.Reason != ReasonQueuedInKueue {
		t.Errorf("Suspended %+v", c)
	}
	var u *unstructured.Unstructured
	testenv.Eventually(t, 20*time.Second, func() (err error) { u, err = workload(job); return err })
	admitWorkload(t, u)
	pods := waitPods(t, job, 2, 1)
	setPods(t, pods, corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)

	label(job, "null")
	testenv.Eventually(t, 20*time.Second, func() error {
		if _, err := workload(job); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the Workload of a job no longer queued is still there (%v)", err)
		}
		return nil
	})
	time.Sleep(time.Second)
	if after := waitPods(t, job, 2, 1); after[0].UID != pods[0].UID || after[1].UID != pods[1].UID {
		t.Errorf("the gang was restarted when the label was removed")
	}
	if got := getJob(t, job); got.Status.State != trainingv1alpha1.StateRunning {
		t.Errorf("state %s after the label was removed", got.Status.State)
	}
}

// The queue label changed on an admitted, running job: the Workload keeps
// the queue it holds quota through (Kueue refuses the edit on its own
// running jobs; Loom has no webhook to), the gang runs on, and the job's
// Ready condition says the move is pending, naming both queues. Once
// Kueue evicts the job and the quota is released, the Workload is
// replaced in the new queue.
func TestKueueQueueMoveOfARunningJobWaits(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-move")
	startManager(t)
	ctx := context.Background()
	workload := func(job *trainingv1alpha1.TrainingJob) (*kueue.Workload, *unstructured.Unstructured, error) {
		return parsedWorkloadOf(t, job)
	}
	job := newJob(ns, "moved", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	create(t, job)
	var u *unstructured.Unstructured
	testenv.Eventually(t, 20*time.Second, func() (err error) { _, u, err = workload(job); return err })
	now := metav1.Now().UTC().Format(time.RFC3339)
	admitWorkload(t, u)
	pods := waitPods(t, job, 2, 1)
	setPods(t, pods, corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)

	if err := env.Client.Patch(ctx, getJob(t, job), client.RawPatch(types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"labels":{%q:"team-b"}}}`, kueue.QueueLabel)))); err != nil {
		t.Fatal(err)
	}
	const note = "names LocalQueue team-b, but its Kueue Workload"
	testenv.Eventually(t, 20*time.Second, func() error {
		c := cond(getJob(t, job), trainingv1alpha1.ConditionReady)
		if c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, note) || !strings.Contains(c.Message, "through LocalQueue team-a: the move to team-b is pending") {
			return fmt.Errorf("Ready: %s %q", c.Status, c.Message)
		}
		return nil
	})
	if got := getJob(t, job); got.Status.State != trainingv1alpha1.StateRunning {
		t.Errorf("state %s while the move is pending", got.Status.State)
	}
	if after := waitPods(t, job, 2, 1); after[0].UID != pods[0].UID || after[1].UID != pods[1].UID {
		t.Errorf("the gang was restarted when the queue label changed")
	}
	if w, _, err := workload(job); err != nil || w.Spec.QueueName != "team-a" || w.UID != u.GetUID() {
		t.Fatalf("the admitted Workload left its queue while it holds quota: %v %+v", err, w)
	}

	later := metav1.Now().UTC().Format(time.RFC3339)
	statusPatch(t, u, fmt.Sprintf(`{"status":{"conditions":[`+
		`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
		`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q},`+
		`{"type":"Evicted","status":"True","reason":"Preempted","message":"preempted","lastTransitionTime":%q}]}}`, now, now, later))
	testenv.Eventually(t, 20*time.Second, func() error {
		w, _, err := workload(job)
		if err != nil {
			return err
		}
		if w.UID == u.GetUID() || w.Spec.QueueName != "team-b" {
			return fmt.Errorf("after the eviction, Workload %s in %q", w.UID, w.Spec.QueueName)
		}
		if c := cond(getJob(t, job), trainingv1alpha1.ConditionReady); strings.Contains(c.Message, note) {
			return fmt.Errorf("Ready still says the move is pending: %q", c.Message)
		}
		return nil
	})
}
