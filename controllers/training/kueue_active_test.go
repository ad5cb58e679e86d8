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

// runAdmitted creates a queued job, admits its Workload as Kueue does and
// runs its gang.
func runAdmitted(t *testing.T, ns, name string) (*trainingv1alpha1.TrainingJob, *unstructured.Unstructured) {
	t.Helper()
	job := newJob(ns, name, 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	create(t, job)
	var u *unstructured.Unstructured
	testenv.Eventually(t, 20*time.Second, func() (err error) { u, err = workloadOf(t, job); return err })
	admitWorkload(t, u)
	setPods(t, waitPods(t, job, 2, 1), corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)
	u, err := workloadOf(t, job)
	if err != nil {
		t.Fatal(err)
	}
	return job, u
}

// kueueEvicts sets the Evicted condition of the admitted Workload u (and
// extra status fields, JSON), as Kueue's workload controller does.
func kueueEvicts(t *testing.T, u *unstructured.Unstructured, reason, msg, extra string) {
	t.Helper()
	now := metav1.Now().UTC().Format(time.RFC3339)
	statusPatch(t, u, fmt.Sprintf(`{"status":{%s"conditions":[`+
		`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
		`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q},`+
		`{"type":"Evicted","status":"True","reason":%q,"message":%q,"lastTransitionTime":%q}]}}`, extra, now, now, reason, msg, now))
}

// setSpec merge-patches the job's spec.runPolicy.suspend.
func setSuspend(t *testing.T, job *trainingv1alpha1.TrainingJob, suspend bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"runPolicy":{"suspend":%t}}}`, suspend)
	if err := env.Client.Patch(context.Background(), getJob(t, job), client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// setActive sets the Workload's spec.active, as a person does.
func setActive(t *testing.T, u *unstructured.Unstructured, active bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"active":%t}}`, active)
	if err := env.Client.Patch(context.Background(), u, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// waitWorkload waits until the job's Workload passes check.
func waitWorkload(t *testing.T, job *trainingv1alpha1.TrainingJob, check func(*kueue.Workload) error) *unstructured.Unstructured {
	t.Helper()
	var u *unstructured.Unstructured
	testenv.Eventually(t, 20*time.Second, func() error {
		w, got, err := parsedWorkloadOf(t, job)
		if err != nil {
			return err
		}
		u = got
		return check(w)
	})
	return u
}

// waitSuspended waits until the job has no pod and says Suspended with
// reason and a message containing each of msgs.
func waitSuspended(t *testing.T, job *trainingv1alpha1.TrainingJob, reason string, msgs ...string) *trainingv1alpha1.TrainingJob {
	t.Helper()
	var got *trainingv1alpha1.TrainingJob
	testenv.Eventually(t, 20*time.Second, func() error {
		if n := len(jobPods(t, job)); n != 0 {
			return fmt.Errorf("%d pods left", n)
		}
		got = getJob(t, job)
		c := cond(got, trainingv1alpha1.ConditionSuspended)
		if got.Status.State != trainingv1alpha1.StateSuspended || c.Status != metav1.ConditionTrue || c.Reason != reason {
			return fmt.Errorf("state %s, Suspended %+v", got.Status.State, c)
		}
		for _, m := range msgs {
			if !strings.Contains(c.Message, m) {
				return fmt.Errorf("Suspended %q does not say %q", c.Message, m)
			}
		}
		return nil
	})
	return got
}

func active(w *kueue.Workload) error {
	if !w.Active() || w.Annotations[trainingv1alpha1.AnnotationWorkloadSuspended] != "" {
		return fmt.Errorf("spec.active %v, annotations %v: want active, unmarked", w.Spec.Active, w.Annotations)
	}
	return nil
}

func deactivatedByLoom(w *kueue.Workload) error {
	if w.Active() || w.Annotations[trainingv1alpha1.AnnotationWorkloadSuspended] == "" {
		return fmt.Errorf("spec.active %v, annotations %v: want deactivated by Loom", w.Spec.Active, w.Annotations)
	}
	return nil
}

// A queued job its user suspends (runPolicy.suspend) gives its quota back
// as Kueue's own jobs do when stopped: its Workload is deactivated, Kueue
// evicts it (Deactivated), and the quota is released once the gang is
// gone, instead of held by a job with no pods until Kueue evicts it for
// another reason. Resumed, the Workload is reactivated, queued and, once
// admitted, runs a new gang. A job suspended at creation gets a deactivated
// Workload: not queued, no quota, until it resumes.
func TestKueueSuspendDeactivatesTheWorkload(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-suspend")
	startManager(t)

	job, _ := runAdmitted(t, ns, "stopped")
	setSuspend(t, job, true)
	u := waitWorkload(t, job, deactivatedByLoom)
	waitSuspended(t, job, ReasonSuspended, "runPolicy.suspend", "is deactivated: Kueue evicts it")
	kueueEvicts(t, u, "Deactivated", "The workload is deactivated", "")
	waitWorkload(t, job, func(w *kueue.Workload) error {
		if w.QuotaReserved() || w.Status.Admission != nil {
			return fmt.Errorf("the suspended job's Workload still holds its quota: %+v", w.Status)
		}
		return nil
	})
	waitSuspended(t, job, ReasonSuspended, "is deactivated and holds no quota")

	setSuspend(t, job, false)
	u = waitWorkload(t, job, active)
	waitSuspended(t, job, ReasonQueuedInKueue, "waiting for Kueue")
	admitWorkload(t, u)
	waitPods(t, job, 2, 2)

	created := newJob(ns, "created-suspended", 1, 0, trainingv1alpha1.GangNone)
	created.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	created.Spec.RunPolicy.Suspend = true
	create(t, created)
	waitWorkload(t, created, deactivatedByLoom)
	waitSuspended(t, created, ReasonSuspended, "is deactivated and holds no quota")
	setSuspend(t, created, false)
	u = waitWorkload(t, created, active)
	admitWorkload(t, u)
	waitPods(t, created, 2, 1)
}

// A Workload deactivated by a person, or by Kueue past its requeuing
// limit, holds the job (WorkloadDeactivated, naming the Workload and
// Kueue's reason; Stalled, for only a person can undo it) and stays
// deactivated, a suspend and resume of the job included; reactivated by
// hand, the job is queued again and runs once admitted.
func TestKueueDeactivatedWorkloadHoldsTheJob(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-deactivated")
	startManager(t)

	job, u := runAdmitted(t, ns, "parked")
	setActive(t, u, false)
	got := waitSuspended(t, job, ReasonWorkloadDeactivated, u.GetName(), "spec.active is false")
	if c := cond(got, trainingv1alpha1.ConditionStalled); c.Status != metav1.ConditionTrue {
		t.Errorf("Stalled %+v, want True: only a person reactivates the Workload (Ready %+v)", c, cond(got, trainingv1alpha1.ConditionReady))
	}
	u, err := workloadOf(t, job)
	if err != nil {
		t.Fatal(err)
	}
	kueueEvicts(t, u, "DeactivatedDueToRequeuingLimitExceeded", "The workload is deactivated due to exceeding the maximum number of re-queuing retries", "")
	waitSuspended(t, job, ReasonWorkloadDeactivated, u.GetName(), "RequeuingLimitExceeded", "re-queuing retries")
	waitWorkload(t, job, func(w *kueue.Workload) error {
		if w.QuotaReserved() {
			return fmt.Errorf("the deactivated Workload still holds its quota")
		}
		return nil
	})

	setSuspend(t, job, true)
	waitSuspended(t, job, ReasonSuspended, "was deactivated by another party")
	setSuspend(t, job, false)
	waitSuspended(t, job, ReasonWorkloadDeactivated, u.GetName())
	if w, _, err := parsedWorkloadOf(t, job); err != nil || w.Active() {
		t.Fatalf("the job's resumption reactivated a Workload Loom did not deactivate (%v)", err)
	}

	u, err = workloadOf(t, job)
	if err != nil {
		t.Fatal(err)
	}
	setActive(t, u, true)
	waitSuspended(t, job, ReasonQueuedInKueue, "waiting for Kueue")
	admitWorkload(t, u)
	waitPods(t, job, 2, 2)
}

// A job evicted for PodsReadyTimeout waits out Kueue's requeue backoff:
// its Suspended condition says when Kueue queues it again and how many
// times it has, and the job is not written while it waits.
func TestKueueRequeueBackoffSaysWhen(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-backoff")
	startManager(t)

	job, u := runAdmitted(t, ns, "slow")
	at := metav1.NewTime(time.Now().Add(time.Hour).Truncate(time.Second))
	kueueEvicts(t, u, "PodsReadyTimeout", "Exceeded the PodsReady timeout "+ns+"/"+u.GetName(),
		fmt.Sprintf(`"requeueState":{"count":2,"requeueAt":%q},`, at.UTC().Format(time.RFC3339)))
	waitWorkload(t, job, func(w *kueue.Workload) error {
		if w.QuotaReserved() {
			return fmt.Errorf("the evicted Workload still holds its quota")
		}
		return nil
	})
	got := waitSuspended(t, job, ReasonEvictedByKueue, "Exceeded the PodsReady timeout",
		"Kueue queues it again at "+at.UTC().Format(time.RFC3339)+" (requeue 2)")
	time.Sleep(3 * time.Second)
	if again := getJob(t, job); again.ResourceVersion != got.ResourceVersion {
		t.Errorf("the job was written while it waits out the backoff: %+v", again.Status.Conditions)
	}

	// The backoff over, Kueue clears requeueAt and sets Requeued.
	u, err := workloadOf(t, job)
	if err != nil {
		t.Fatal(err)
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for i, c := range conds {
		if m := c.(map[string]any); m["type"] == "Requeued" {
			m["status"], m["reason"], m["message"] = "True", "BackoffFinished", "The workload backoff was finished"
			conds[i] = m
		}
	}
	if err := unstructured.SetNestedSlice(u.Object, conds, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	unstructured.RemoveNestedField(u.Object, "status", "requeueState", "requeueAt")
	if err := env.Client.Status().Update(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	got = waitSuspended(t, job, ReasonEvictedByKueue, "Exceeded the PodsReady timeout", "Kueue queued it again")
	if strings.Contains(cond(got, trainingv1alpha1.ConditionSuspended).Message, "queues it again at") {
		t.Errorf("Suspended %q still names the backoff's end", cond(got, trainingv1alpha1.ConditionSuspended).Message)
	}
}

// A queue label no LocalQueue can be named by (a label value such as
// Team_A, which Kueue's webhook refuses on its own jobs and its Workload
// CRD refuses in spec.queueName) holds the job, InvalidSpec naming the
// label, without a Workload, instead of a create the API server refuses on
// every pass; mended, the job is queued.
func TestKueueQueueNameNoLocalQueueCanHave(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-badqueue")
	startManager(t)

	job := newJob(ns, "misnamed", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "Team_A"}
	create(t, job)
	got := waitSuspended(t, job, ReasonInvalidSpec, kueue.QueueLabel, `"Team_A"`)
	if c := cond(got, trainingv1alpha1.ConditionStalled); c.Status != metav1.ConditionTrue {
		t.Errorf("Stalled %+v, want True", c)
	}
	if _, err := workloadOf(t, job); !apierrors.IsNotFound(err) {
		t.Errorf("a Workload for a queue no LocalQueue can be named by (%v)", err)
	}
	setQueueLabel(t, job, `"team-a"`)
	waitWorkload(t, job, func(w *kueue.Workload) error {
		if w.Spec.QueueName != "team-a" {
			return fmt.Errorf("queue %q", w.Spec.QueueName)
		}
		return nil
	})
	waitSuspended(t, job, ReasonQueuedInKueue, "waiting for Kueue")
}

// A queued job deleted while its Workload is admitted gives the quota back
// at once: its Workload is deleted by Loom, as Kueue's own integrations
// do, not left to the garbage collector (which envtest does not run), both
// when the job is gone and while a foreground deletion keeps it.
func TestKueueDeletedJobReleasesItsWorkload(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-deleted")
	startManager(t)
	for _, policy := range []metav1.DeletionPropagation{metav1.DeletePropagationBackground, metav1.DeletePropagationForeground} {
		job, u := runAdmitted(t, ns, strings.ToLower(string(policy)))
		if err := env.Client.Delete(context.Background(), getJob(t, job), client.PropagationPolicy(policy)); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, func() error {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(kueue.WorkloadGVK)
			err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(u), got)
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("%s deletion: the Workload of a deleted job is still there (%v)", policy, err)
		})
	}
}
