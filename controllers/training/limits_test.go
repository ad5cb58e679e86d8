package training

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/podset"
)

// stalePods are the first n workers of attempt 0 of job, not yet being
// deleted.
func stalePods(job *trainingv1alpha1.TrainingJob, n int32) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range n {
		p := buildPod(job, pytorch{}, trainingv1alpha1.RoleWorker, i, 0, trainingv1alpha1.GangNone)
		p.UID = types.UID(p.Name)
		out = append(out, p)
	}
	return out
}

// The phases that bound a pass's work and hold what a pass must not do:
// the pod limit, the per-pass cap, deadlines past a duration's range, and
// pods that are not the gang's.
func TestDecideBoundsHostileJobs(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name    string
		workers int32
		setup   func(job *trainingv1alpha1.TrainingJob, obs *observed)
		check   func(t *testing.T, job *trainingv1alpha1.TrainingJob, d decision)
	}{
		{"a big gang builds only one pass of pods", 1200, nil, func(t *testing.T, _ *trainingv1alpha1.TrainingJob, d decision) {
			if len(d.create) != podset.PerPass || d.deferred != 1201-podset.PerPass || d.create[0].Name != "j-master-0" || d.create[499].Name != "j-worker-498" {
				t.Fatalf("create %d (first %s) deferred %d", len(d.create), d.create[0].Name, d.deferred)
			}
		}},
		{"deletes take from the pass's budget", podset.PerPass + 100, func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			obs.pods = stalePods(job, 100)
			job.Status.Attempt = 1
		}, func(t *testing.T, _ *trainingv1alpha1.TrainingJob, d decision) {
			// 100 names wait for their old pods; PerPass-100 of the other
			// PerPass+1 are built.
			if len(d.remove) != 100 || len(d.create) != podset.PerPass-100 || d.deferred != 101 {
				t.Fatalf("remove %d create %d deferred %d", len(d.remove), len(d.create), d.deferred)
			}
		}},
		{"a gang over the limit is held", 5000, nil, func(t *testing.T, _ *trainingv1alpha1.TrainingJob, d decision) {
			heldTooMany(t, d, "asks for 5001 pods (1 master + 5000 workers)", "--max-workload-pods=5000")
			if r := reasons(d); len(r) != 1 || r[0] != ReasonTooManyPods {
				t.Fatalf("events %v", r)
			}
		}},
		{"the manager's limit applies", 10, func(_ *trainingv1alpha1.TrainingJob, obs *observed) { obs.maxPods = 10 }, func(t *testing.T, _ *trainingv1alpha1.TrainingJob, d decision) {
			heldTooMany(t, d, "asks for 11 pods", "--max-workload-pods=10")
		}},
		{"a replica count near int32's limit does not wrap", math.MaxInt32, nil, func(t *testing.T, _ *trainingv1alpha1.TrainingJob, d decision) {
			heldTooMany(t, d, "asks for 2147483648 pods", "")
		}},
		{"a held job says so once", 5000, func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Status = decide(job, *obs, trainingv1alpha1.GangNone).status
		}, func(t *testing.T, _ *trainingv1alpha1.TrainingJob, d decision) {
			heldTooMany(t, d, "5001", "")
			if len(d.events) != 0 {
				t.Fatalf("events again: %v", reasons(d))
			}
		}},
		{"activeDeadlineSeconds past a duration's range does not fail the first pass", 1, func(job *trainingv1alpha1.TrainingJob, _ *observed) {
			job.Spec.RunPolicy.ActiveDeadlineSeconds = ptr(int64(math.MaxInt64))
		}, func(t *testing.T, _ *trainingv1alpha1.TrainingJob, d decision) {
			if d.status.State != trainingv1alpha1.StatePending || len(d.create) != 2 || d.requeue < 100*365*24*time.Hour {
				t.Fatalf("state %s create %d requeue %s", d.status.State, len(d.create), d.requeue)
			}
		}},
		{"the API's longest deadline", 1, func(job *trainingv1alpha1.TrainingJob, _ *observed) {
			job.Spec.RunPolicy.ActiveDeadlineSeconds = ptr(int64(trainingv1alpha1.MaxSeconds))
		}, func(t *testing.T, _ *trainingv1alpha1.TrainingJob, d decision) {
			if want := trainingv1alpha1.MaxSeconds * time.Second; d.status.State != trainingv1alpha1.StatePending || d.requeue != want {
				t.Fatalf("state %s requeue %s, want %s", d.status.State, d.requeue, want)
			}
		}},
		{"a deadline past a duration's range, started three centuries ago, has passed", 1, func(job *trainingv1alpha1.TrainingJob, _ *observed) {
			job.Spec.RunPolicy.ActiveDeadlineSeconds = ptr(int64(300 * 365 * 24 * 3600))
			job.Status.StartTime = &metav1.Time{Time: now.AddDate(-301, 0, 0)}
		}, func(t *testing.T, _ *trainingv1alpha1.TrainingJob, d decision) {
			if c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionFailed); c == nil || c.Reason != ReasonDeadlineExceeded {
				t.Fatalf("Failed = %+v", c)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := newJob("ns", "j", tt.workers, 0, trainingv1alpha1.GangNone)
			job.UID = "job-uid"
			obs := observed{now: now, fit: inventory.FitResult{Verdict: inventory.FitsNow}}
			if tt.setup != nil {
				tt.setup(job, &obs)
			}
			tt.check(t, job, decide(job, obs, trainingv1alpha1.GangNone))
		})
	}
}

// heldTooMany checks a decision holding a job over the pod limit.
func heldTooMany(t *testing.T, d decision, says ...string) {
	t.Helper()
	if d.status.State != trainingv1alpha1.StateHeld || len(d.create) != 0 || d.deferred != 0 || len(d.children) != 0 || d.podGroup != nil {
		t.Fatalf("state %s create %d deferred %d children %d PodGroup %v", d.status.State, len(d.create), d.deferred, len(d.children), d.podGroup != nil)
	}
	for _, typ := range []string{trainingv1alpha1.ConditionCreated, trainingv1alpha1.ConditionScheduled, trainingv1alpha1.ConditionReady} {
		c := meta.FindStatusCondition(d.status.Conditions, typ)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonTooManyPods {
			t.Fatalf("%s = %+v", typ, c)
		}
		for _, s := range says {
			if !strings.Contains(c.Message, s) {
				t.Fatalf("%s says %q, want %q", typ, c.Message, s)
			}
		}
	}
}

// Pods decide is given that are not the gang's: another job's and a
// stranger's are never touched, a pod of the job it does not want (an index
// past the replicas, a name its labels do not give) is removed.
func TestDecideTouchesOnlyTheGangsPods(t *testing.T) {
	now := time.Now()
	job, pods := runningGang(t, now)
	other := newJob("ns", "j2", 1, 0, trainingv1alpha1.GangNone)
	other.UID = "other-uid"
	theirs := buildPod(other, pytorch{}, trainingv1alpha1.RoleWorker, 0, 0, trainingv1alpha1.GangNone)
	stranger := buildPod(job, pytorch{}, trainingv1alpha1.RoleWorker, 0, 0, trainingv1alpha1.GangNone)
	stranger.Name, stranger.OwnerReferences = "j-worker-7", nil
	extra := buildPod(job, pytorch{}, trainingv1alpha1.RoleWorker, 5, 0, trainingv1alpha1.GangNone)
	misnamed := buildPod(job, pytorch{}, trainingv1alpha1.RoleWorker, 0, 0, trainingv1alpha1.GangNone)
	misnamed.Name = "j-worker-9"
	for i, p := range []*corev1.Pod{theirs, stranger, extra, misnamed} {
		p.UID = types.UID(fmt.Sprint("x", i))
		p.Status.Phase = corev1.PodRunning
	}
	obs := observed{pods: append(pods, theirs, stranger, extra, misnamed), now: now, fit: inventory.FitResult{Verdict: inventory.FitsNow}}

	d := decide(job, obs, trainingv1alpha1.GangNone)
	if got := podNames(d.remove); got != "j-worker-5 j-worker-9" || d.status.State != trainingv1alpha1.StateRunning || d.status.ReplicaStatuses.Worker.Active != 1 {
		t.Fatalf("remove %q state %s workers %+v", got, d.status.State, d.status.ReplicaStatuses.Worker)
	}
	job.Spec.RunPolicy.Suspend = true
	if got := podNames(decide(job, obs, trainingv1alpha1.GangNone).remove); got != "j-master-0 j-worker-0 j-worker-5 j-worker-9" {
		t.Fatalf("suspending removes %q", got)
	}
}

func podNames(pods []*corev1.Pod) string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return strings.Join(out, " ")
}

// A name taken by an object the job does not control says NameConflict,
// naming it; an earlier attempt's pod still there is no conflict.
func TestAppliedNameConflict(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name   string
		err    error
		reason string
		says   string
	}{
		{"a stranger's pod", fmt.Errorf("creating pod j-worker-0: %w", &podset.ConflictError{Namespace: "ns", Pod: "j-worker-0", Owner: "j"}), ReasonNameConflict, "pod j-worker-0 exists and is not controlled by j"},
		{"an earlier attempt's pod", fmt.Errorf("creating pod j-worker-0: %w", &podset.ConflictError{Namespace: "ns", Pod: "j-worker-0", Owner: "j", EarlierAttempt: true}), ReasonCreateFailed, "of an earlier attempt"},
		{"a user's Service", fmt.Errorf("%w: rename the job or the Service", &apply.ForeignError{Kind: "Service", Key: "ns/j", Reason: "is not managed by Loom"}), ReasonNameConflict, "Service ns/j exists"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := trainingv1alpha1.TrainingJobStatus{}
			applied(&st, tt.err, 1, now)
			for _, typ := range []string{trainingv1alpha1.ConditionCreated, trainingv1alpha1.ConditionReady} {
				if c := meta.FindStatusCondition(st.Conditions, typ); c == nil || c.Reason != tt.reason || !strings.Contains(c.Message, tt.says) {
					t.Fatalf("%s = %+v, want %s saying %q", typ, c, tt.reason, tt.says)
				}
			}
		})
	}
}

func TestUntil(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		start time.Time
		n     int64
		want  time.Duration
	}{
		{now, 60, time.Minute},
		{now.Add(-time.Hour), 60, -59 * time.Minute},
		{now, 0, 0},
		{now, -5, 0},
		{now, math.MaxInt64, math.MaxInt64},
		{now.AddDate(-100, 0, 0), math.MaxInt64, math.MaxInt64},
		{now.AddDate(-400, 0, 0), 300 * 365 * 24 * 3600, 0},
		{now.Add(10 * time.Second), math.MaxInt64, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := until(tt.start, tt.n, now); got != tt.want && (tt.want != 0 || got >= 0) {
			t.Errorf("until(%s, %d) = %s, want %s", tt.start, tt.n, got, tt.want)
		}
	}
}

// A job one of whose pod names a stranger's pod holds is held before
// anything of it is made: no pod, Service or PodGroup (an earlier one
// goes), NameConflict naming the pod, Stalled, and it looks again soon,
// since that pod's deletion does not wake it.
func TestDecideHoldsAJobWhosePodNameIsTaken(t *testing.T) {
	job := newJob("ns", "j", 3, 0, trainingv1alpha1.GangVolcano)
	const taken = "pod j-worker-1 exists and is not controlled by j: rename the job, or delete the pod"
	d := decide(job, observed{now: time.Now(), volcano: true, taken: taken, podGroup: buildPodGroup(job, 0),
		fit: inventory.FitResult{Verdict: inventory.FitsNow}}, trainingv1alpha1.GangNone)
	if d.status.State != trainingv1alpha1.StateHeld || len(d.create) != 0 || d.deferred != 0 || len(d.children) != 0 || d.podGroup != nil || !d.removePodGroup {
		t.Fatalf("state %s create %d deferred %d children %d PodGroup %v removePodGroup %v",
			d.status.State, len(d.create), d.deferred, len(d.children), d.podGroup != nil, d.removePodGroup)
	}
	for _, typ := range []string{trainingv1alpha1.ConditionCreated, trainingv1alpha1.ConditionReady} {
		if c := meta.FindStatusCondition(d.status.Conditions, typ); c == nil || c.Reason != ReasonNameConflict || !strings.Contains(c.Message, taken) {
			t.Fatalf("%s = %+v", typ, c)
		}
	}
	if !condTrue(&d.status, trainingv1alpha1.ConditionStalled) || d.requeue <= 0 || d.requeue > conflictPoll {
		t.Fatalf("Stalled %v, requeue %s", condTrue(&d.status, trainingv1alpha1.ConditionStalled), d.requeue)
	}
	if why := cannotRun(job, &observed{taken: taken}); why == "" {
		t.Fatal("a job whose pod name is taken gets a Kueue Workload")
	}
}
