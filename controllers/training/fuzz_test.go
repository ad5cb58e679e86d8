package training

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/podset"
)

// fuzzSpec is FuzzDecide's input, decoded: the job's spec and status
// knobs, the clock and the observed pods (six bytes each).
type fuzzSpec struct {
	workers, backoff, ttl, minAvail, attempt, restarts int32
	deadline, startAgo                                 int64
	flags                                              uint32
	maxPods                                            uint16
	pods                                               []byte
}

func (f fuzzSpec) bit(i uint) bool { return f.flags&(1<<i) != 0 }

var fuzzStates = []trainingv1alpha1.JobState{"", trainingv1alpha1.StatePending, trainingv1alpha1.StateRunning, trainingv1alpha1.StateRestarting,
	trainingv1alpha1.StateSuspended, trainingv1alpha1.StateSucceeded, trainingv1alpha1.StateFailed, trainingv1alpha1.StateHeld}

// job builds the fuzzed job: bits 0-2 set backoffLimit, the deadline and
// the TTL, 3 suspends it, 4-5 pick the scheduler, 6 whenNeverFits Fail, 8
// minAvailable, 9-11 the state, 12-14 Scheduled, Running and Suspended
// true, 19 leaves worker replicas unset, 20 sets a completion time, 21
// custom retryable codes, 22 GPUs.
func (f fuzzSpec) job(now time.Time) *trainingv1alpha1.TrainingJob {
	gpus := int64(0)
	if f.bit(22) {
		gpus = 8
	}
	job := newJob("ns", "j", f.workers, gpus, []trainingv1alpha1.GangScheduler{"", trainingv1alpha1.GangVolcano, trainingv1alpha1.GangNone, ""}[f.flags>>4&3])
	job.UID, job.Generation = "job-uid", 1
	rp := &job.Spec.RunPolicy
	if f.bit(0) {
		rp.BackoffLimit = &f.backoff
	}
	if f.bit(1) {
		rp.ActiveDeadlineSeconds = &f.deadline
	}
	if f.bit(2) {
		rp.TTLSecondsAfterFinished = &f.ttl
	}
	rp.Suspend = f.bit(3)
	if f.bit(6) {
		job.Spec.Gang.WhenNeverFits = trainingv1alpha1.NeverFitsFail
	}
	if f.bit(8) {
		job.Spec.Gang.MinAvailable = &f.minAvail
	}
	if f.bit(19) {
		job.Spec.ReplicaSpecs.Worker.Replicas = nil
	}
	if f.bit(21) {
		job.Spec.FailurePolicy.RetryableExitCodes = []trainingv1alpha1.ExitCodeRange{{Min: 1, Max: ptr(int32(2))}}
	}
	st := &job.Status
	st.State, st.Attempt, st.Restarts = fuzzStates[f.flags>>9&7], f.attempt, f.restarts
	if f.startAgo != 0 { // negative: a start ahead of this clock
		start := now.Add(-seconds(f.startAgo))
		if f.startAgo < 0 {
			start = now.Add(seconds(-(f.startAgo + 1)))
		}
		t := metav1.NewTime(start)
		st.StartTime = &t
	}
	if f.bit(20) {
		t := metav1.NewTime(now.Add(-seconds(int64(f.ttl))))
		st.CompletionTime = &t
	}
	for i, c := range []string{trainingv1alpha1.ConditionScheduled, trainingv1alpha1.ConditionRunning, trainingv1alpha1.ConditionSuspended} {
		if f.bit(uint(12 + i)) {
			setCond(st, c, metav1.ConditionTrue, "Fuzz", "fuzz", 1, now)
		}
	}
	return job
}

// observed builds what the pass sees: bit 7 Volcano installed, 15 a gang
// that never fits, 16-17 the PodGroup (none, this attempt's Pending or
// Running, an earlier attempt's).
func (f fuzzSpec) observed(job *trainingv1alpha1.TrainingJob, now time.Time) observed {
	obs := observed{now: now, volcano: f.bit(7), maxPods: int(f.maxPods), fit: inventory.FitResult{Verdict: inventory.FitsNow}}
	if f.bit(15) {
		obs.fit = inventory.FitResult{Verdict: inventory.Never, Message: "never"}
	}
	if pg := f.flags >> 16 & 3; pg != 0 {
		obs.podGroup = &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns", UID: "pg-uid",
			Labels: map[string]string{LabelAttempt: strconv.Itoa(int(job.Status.Attempt))}}}
		obs.podGroup.Status.Phase = []schedulingv1beta1.PodGroupPhase{"", schedulingv1beta1.PodGroupPending, schedulingv1beta1.PodGroupRunning, schedulingv1beta1.PodGroupRunning}[pg]
		if pg == 3 {
			obs.podGroup.Labels[LabelAttempt] = strconv.Itoa(int(job.Status.Attempt) - 1)
		}
	}
	seen := map[string]bool{}
	for i := 0; i+6 <= len(f.pods) && i < 6*64; i += 6 {
		if p := fuzzPod(job, f.pods[i:i+6], i/6); !seen[p.Namespace+"/"+p.Name] {
			seen[p.Namespace+"/"+p.Name] = true // the API server's names are unique
			obs.pods = append(obs.pods, p)
		}
	}
	return obs
}

var fuzzPhases = []corev1.PodPhase{"", corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed}

// fuzzPod is one observed pod from b: b[0] its kind (the job's own, own
// and terminating, another job's, a stranger's with the job's labels, own
// with a garbage index, own under a name its labels do not give, in another
// namespace, own but not yet in the cache), b[1] the role (bit 1: none
// Loom knows), b[2] the index, b[3] the attempt relative to the job's, b[4]
// the phase (bit 3: evicted, bit 4: bound), b[5] the exit code.
func fuzzPod(job *trainingv1alpha1.TrainingJob, b []byte, n int) *corev1.Pod {
	role := []trainingv1alpha1.Role{trainingv1alpha1.RoleMaster, trainingv1alpha1.RoleWorker}[b[1]&1]
	index := int32(int8(b[2]))
	attempt := int64(job.Status.Attempt) + int64(int8(b[3]))
	p := buildPod(job, pytorch{}, role, index, 0, trainingv1alpha1.GangNone)
	p.UID = types.UID(fmt.Sprintf("uid-%d", n))
	p.Labels[LabelAttempt] = strconv.FormatInt(attempt, 10)
	if b[1]&2 != 0 {
		p.Labels[LabelReplicaType] = "ps"
	}
	switch b[0] & 7 {
	case 1:
		ts := metav1.NewTime(time.Unix(0, 0))
		p.DeletionTimestamp = &ts
	case 2:
		p.Labels[LabelJobName] = "other"
		p.Name = PodName("other", role, index)
		p.OwnerReferences[0].UID, p.OwnerReferences[0].Name = "other-uid", "other"
	case 3:
		p.OwnerReferences = nil
	case 4:
		p.Labels[LabelReplicaIndex] = "x"
	case 5:
		p.Name = fmt.Sprintf("j-%s-%d", role, int(index)+1)
	case 6:
		p.Namespace = "elsewhere"
	case 7:
		p.UID = ""
	}
	p.Status.Phase = fuzzPhases[int(b[4]&7)%len(fuzzPhases)]
	if b[4]&8 != 0 {
		p.Status.Reason = "Evicted"
	}
	if b[4]&16 != 0 {
		p.Spec.NodeName = "node"
	}
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(b[5])}}}}
	}
	return p
}

// FuzzDecide feeds decide careless and hostile jobs (any replica count,
// backoff, deadline up to and past what a duration holds, TTL, suspension,
// gang policy, any status) and observed pods (any attempt, phase, exit
// code, name; other jobs' and strangers'). Whatever it gets, decide must
// not panic, create more pods than the gang wants or one pass creates,
// keep a pod of another attempt as current, touch a pod that is not the
// job's, create anything for a job over the pod limit, or fail a job on a
// deadline that has not passed.
func FuzzDecide(f *testing.F) {
	f.Add(int32(2), int32(3), int32(30), int32(1), int32(0), int32(0), int64(60), int64(10), uint32(0b110), uint16(0), []byte{0, 0, 0, 0, 2, 0, 0, 1, 0, 0, 2, 0, 0, 1, 1, 0, 4, 137})
	// activeDeadlineSeconds past a duration's range on the first pass.
	f.Add(int32(1), int32(0), int32(0), int32(0), int32(0), int32(0), int64(math.MaxInt64), int64(0), uint32(0b10), uint16(0), []byte{})
	f.Add(int32(1), int32(0), int32(0), int32(0), int32(0), int32(0), int64(math.MaxInt64), int64(-10), uint32(0b10), uint16(0), []byte{})
	f.Add(int32(math.MaxInt32), int32(0), int32(0), int32(0), int32(0), int32(0), int64(0), int64(0), uint32(0), uint16(0), []byte{})
	f.Add(int32(1200), int32(0), int32(0), int32(0), int32(0), int32(0), int64(0), int64(0), uint32(0), uint16(2000), []byte{})
	f.Add(int32(3), int32(1), int32(5), int32(2), int32(math.MaxInt32), int32(1), int64(1), int64(100), uint32(0x7fffff), uint16(10), []byte{3, 1, 0, 0, 2, 0, 2, 1, 1, 0, 4, 1, 5, 1, 0, 0, 3, 0, 1, 0, 0, 0xff, 2, 0})
	f.Fuzz(func(t *testing.T, workers, backoff, ttl, minAvail, attempt, restarts int32, deadline, startAgo int64, flags uint32, maxPods uint16, pods []byte) {
		in := fuzzSpec{workers: workers, backoff: backoff, ttl: ttl, minAvail: minAvail, attempt: attempt, restarts: restarts,
			deadline: deadline, startAgo: startAgo, flags: flags, maxPods: maxPods, pods: pods}
		now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
		job := in.job(now)
		obs := in.observed(job, now)
		def := []trainingv1alpha1.GangScheduler{trainingv1alpha1.GangNone, trainingv1alpha1.GangVolcano}[flags>>18&1]
		before := job.DeepCopy()
		d := decide(job, obs, def)
		if !equality.Semantic.DeepEqual(before, job) {
			t.Fatal("decide changed the job it was given")
		}
		again := decide(job, in.observed(job, now), def)
		if !equality.Semantic.DeepEqual(d.status, again.status) || len(d.create) != len(again.create) || len(d.remove) != len(again.remove) {
			t.Fatal("decide is not deterministic")
		}
		checkDecision(t, job, obs, d)
	})
}

// checkDecision holds FuzzDecide's invariants.
func checkDecision(t *testing.T, job *trainingv1alpha1.TrainingJob, obs observed, d decision) {
	t.Helper()
	own := map[*corev1.Pod]bool{}
	names := map[string]bool{}
	for _, p := range ownPods(job, obs.pods) {
		own[p], names[p.Name] = true, true
	}
	checkCreates(t, job, obs, d, names)
	removed := map[*corev1.Pod]bool{}
	for _, p := range d.remove {
		if !own[p] {
			t.Fatalf("removes pod %s/%s (owner %v, job label %q), which is not the job's", p.Namespace, p.Name, p.OwnerReferences, p.Labels[LabelJobName])
		}
		if removed[p] {
			t.Fatalf("removes pod %s twice", p.Name)
		}
		removed[p] = true
	}
	for p := range own {
		if _, _, a, ok := podIdentity(p); p.DeletionTimestamp == nil && (!ok || a != d.status.Attempt) && !removed[p] {
			t.Fatalf("pod %s (attempt label %q) of another attempt than %d is kept", p.Name, p.Labels[LabelAttempt], d.status.Attempt)
		}
	}
	rs := d.status.ReplicaStatuses
	if n := rs.Master.Active + rs.Master.Succeeded + rs.Master.Failed + rs.Worker.Active + rs.Worker.Succeeded + rs.Worker.Failed; int(n) > len(own) {
		t.Fatalf("counts %d pods of %d", n, len(own))
	}
	if d.requeue < 0 {
		t.Fatalf("requeue %s", d.requeue)
	}
	if dl := job.Spec.RunPolicy.ActiveDeadlineSeconds; dl != nil && *dl > 0 && !job.Status.Finished() {
		elapsed := int64(0)
		if job.Status.StartTime != nil {
			elapsed = obs.now.Unix() - job.Status.StartTime.Unix()
		}
		for _, e := range d.events {
			if e.reason == ReasonDeadlineExceeded && elapsed < *dl {
				t.Fatalf("failed on activeDeadlineSeconds %d after %ds: %s", *dl, elapsed, e.msg)
			}
		}
	}
	for _, c := range d.status.Conditions {
		if len(c.Message) > apply.MaxConditionMessage {
			t.Fatalf("condition %s: message of %d bytes", c.Type, len(c.Message))
		}
	}
}

// checkCreates: what decide creates is the job's, of the current attempt,
// wanted by the gang, not yet there, within one pass, and nothing for a
// job that is over the limit, finished or suspended.
func checkCreates(t *testing.T, job *trainingv1alpha1.TrainingJob, obs observed, d decision, taken map[string]bool) {
	t.Helper()
	total := totalPods(job)
	over := total > int64(maxPods(obs.maxPods))
	if (over || d.status.Finished() || job.Spec.RunPolicy.Suspend) && (len(d.create) > 0 || d.podGroup != nil || d.deferred > 0) {
		t.Fatalf("over the limit %v, finished %v, suspended %v: creates %d pods, PodGroup %v", over, d.status.Finished(), job.Spec.RunPolicy.Suspend, len(d.create), d.podGroup != nil)
	}
	if over && !d.status.Finished() && !job.Spec.RunPolicy.Suspend && !d.restarted {
		if c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionReady); d.status.State != trainingv1alpha1.StateHeld || c == nil || c.Reason != ReasonTooManyPods {
			t.Fatalf("a job of %d pods over the limit is %s (Ready %+v)", total, d.status.State, c)
		}
	}
	if len(d.create) > podset.PerPass || int64(len(d.create)+d.deferred) > total {
		t.Fatalf("creates %d (deferred %d) of a gang of %d, at most %d a pass", len(d.create), d.deferred, total, podset.PerPass)
	}
	for _, p := range d.create {
		role, index, a, ok := podIdentity(p)
		switch {
		case !ok || a != d.status.Attempt:
			t.Fatalf("creates %s of attempt %q, the job's is %d", p.Name, p.Labels[LabelAttempt], d.status.Attempt)
		case !wanted(job, role, index, p.Name) || p.Namespace != job.Namespace || !metav1.IsControlledBy(p, job) || p.Labels[LabelJobName] != job.Name:
			t.Fatalf("creates %s/%s, which the gang does not want", p.Namespace, p.Name)
		case taken[p.Name]:
			t.Fatalf("creates %s, whose name a pod of the job holds", p.Name)
		}
		taken[p.Name] = true
	}
}
