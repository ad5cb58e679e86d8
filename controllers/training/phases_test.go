package training

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/podset"
)

// runningGang is a job of one master and one worker whose pods of attempt
// 0 run, with the conditions a running gang has.
func runningGang(t *testing.T, now time.Time) (*trainingv1alpha1.TrainingJob, []*corev1.Pod) {
	t.Helper()
	job := newJob("ns", "j", 1, 0, trainingv1alpha1.GangNone)
	job.UID = "job-uid"
	d := decide(job, observed{now: now, fit: inventory.FitResult{Verdict: inventory.FitsNow}}, trainingv1alpha1.GangNone)
	pods := d.create
	for i, p := range pods {
		p.UID = types.UID(p.Name)
		p.Spec.NodeName = "n"
		p.Status.Phase = corev1.PodRunning
		pods[i] = p
	}
	job.Status = d.status
	d = decide(job, observed{pods: pods, now: now}, trainingv1alpha1.GangNone)
	if d.status.State != trainingv1alpha1.StateRunning {
		t.Fatalf("setup: state %s", d.status.State)
	}
	job.Status = d.status
	return job, pods
}

func reasons(d decision) []string {
	var out []string
	for _, e := range d.events {
		out = append(out, e.reason)
	}
	return out
}

// Each phase of decide, from the job's and the cluster's side.
func TestDecidePhases(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name  string
		setup func(job *trainingv1alpha1.TrainingJob, obs *observed)
		check func(t *testing.T, d decision)
	}{
		{"deadline passed fails the job", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Spec.RunPolicy.ActiveDeadlineSeconds = ptr(int64(60))
			job.Status.StartTime = &metav1.Time{Time: now.Add(-2 * time.Minute)}
		}, func(t *testing.T, d decision) {
			if c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionFailed); c == nil || c.Reason != ReasonDeadlineExceeded {
				t.Fatalf("Failed = %+v", c)
			}
			if len(d.remove) != 2 || !d.removePodGroup || len(d.create) != 0 {
				t.Fatalf("remove %d removePodGroup %v create %d", len(d.remove), d.removePodGroup, len(d.create))
			}
		}},
		{"deadline ahead asks to look again then", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Spec.RunPolicy.ActiveDeadlineSeconds = ptr(int64(60))
			job.Status.StartTime = &metav1.Time{Time: now.Add(-10 * time.Second)}
		}, func(t *testing.T, d decision) {
			if d.status.State != trainingv1alpha1.StateRunning || d.requeue != 50*time.Second {
				t.Fatalf("state %s requeue %s", d.status.State, d.requeue)
			}
		}},
		{"suspend deletes the gang", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Spec.RunPolicy.Suspend = true
		}, func(t *testing.T, d decision) {
			if d.status.State != trainingv1alpha1.StateSuspended || len(d.remove) != 2 || !d.removePodGroup || len(d.children) != 0 {
				t.Fatalf("state %s remove %d children %d", d.status.State, len(d.remove), len(d.children))
			}
			if r := reasons(d); len(r) != 1 || r[0] != ReasonSuspended {
				t.Fatalf("events %v", r)
			}
		}},
		{"a vanished pod restarts the gang", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			obs.pods = obs.pods[:1]
		}, func(t *testing.T, d decision) {
			if !d.restarted || d.status.Attempt != 1 || d.status.Restarts != 1 || len(d.create) != 0 || len(d.children) != 0 || d.podGroup != nil {
				t.Fatalf("restarted %v attempt %d restarts %d create %d children %d", d.restarted, d.status.Attempt, d.status.Restarts, len(d.create), len(d.children))
			}
			if len(d.remove) != 1 || d.status.State != trainingv1alpha1.StateRestarting {
				t.Fatalf("remove %d state %s", len(d.remove), d.status.State)
			}
		}},
		// A lost node's pods are deleted by the taint manager, but no
		// kubelet confirms it: they stay Terminating for good. The gang
		// is broken from the moment its pod is deleted.
		{"a pod of a running gang stuck terminating on a lost node restarts it", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			ts := metav1.NewTime(now)
			obs.pods[1].DeletionTimestamp = &ts
			obs.pods[1].Status.Conditions = append(obs.pods[1].Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget,
				Status: corev1.ConditionTrue, Reason: "DeletionByTaintManager", Message: "Taint manager: deleting due to NoExecute taint"})
		}, func(t *testing.T, d decision) {
			if !d.restarted || d.status.Attempt != 1 || d.status.Restarts != 1 || d.status.State != trainingv1alpha1.StateRestarting {
				t.Fatalf("restarted %v attempt %d restarts %d state %s; want the gang restarted", d.restarted, d.status.Attempt, d.status.Restarts, d.status.State)
			}
			if len(d.remove) != 1 || d.remove[0].Name != "j-master-0" {
				t.Fatalf("removes %s; want the rest of the gang, j-master-0", podNames(d.remove))
			}
			if c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionRestarting); c == nil ||
				!strings.Contains(c.Message, "pod j-worker-0 is being deleted (DeletionByTaintManager: Taint manager") {
				t.Fatalf("Restarting = %+v", c)
			}
		}},
		{"a deleted pod of a running gang restarts it before it is gone", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			ts := metav1.NewTime(now)
			obs.pods[0].DeletionTimestamp = &ts
		}, func(t *testing.T, d decision) {
			c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionRestarting)
			if !d.restarted || len(d.remove) != 1 || c == nil || !strings.Contains(c.Message, "pod j-master-0 is being deleted") {
				t.Fatalf("restarted %v remove %d Restarting %+v", d.restarted, len(d.remove), c)
			}
		}},
		// A pod gone from under a running gang (a lost node's pods are
		// force-deleted by the pod garbage collector) did not fail: as
		// the Training Operator, which recreates it, Loom does not count
		// it against the backoff limit.
		{"a vanished pod past the backoff limit restarts the gang, as a disruption", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Spec.RunPolicy.BackoffLimit = ptr(int32(0))
			obs.pods = obs.pods[:1]
		}, func(t *testing.T, d decision) {
			c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionRestarting)
			if !d.restarted || d.status.Restarts != 1 || d.status.Disruptions != 1 || c == nil || !strings.Contains(c.Message, "not counted against runPolicy.backoffLimit") {
				t.Fatalf("restarted %v restarts %d disruptions %d Restarting %+v", d.restarted, d.status.Restarts, d.status.Disruptions, c)
			}
		}},
		{"a failure past the backoff limit fails the job", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			job.Spec.RunPolicy.BackoffLimit = ptr(int32(0))
			obs.pods[1].Status.Phase = corev1.PodFailed
			obs.pods[1].Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}}}
		}, func(t *testing.T, d decision) {
			c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionFailed)
			if d.restarted || c == nil || c.Reason != ReasonBackoffLimit {
				t.Fatalf("restarted %v Failed %+v", d.restarted, c)
			}
		}},
		{"a failed worker with a retryable code restarts", func(job *trainingv1alpha1.TrainingJob, obs *observed) {
			obs.pods[1].Status.Phase = corev1.PodFailed
			obs.pods[1].Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}}}
		}, func(t *testing.T, d decision) {
			if !d.restarted || len(d.remove) != 2 {
				t.Fatalf("restarted %v remove %d", d.restarted, len(d.remove))
			}
			if r := reasons(d); len(r) != 1 || r[0] != ReasonRetryableFailure || !d.events[0].warning {
				t.Fatalf("events %+v", d.events)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job, pods := runningGang(t, now)
			obs := observed{pods: pods, now: now, fit: inventory.FitResult{Verdict: inventory.FitsNow}}
			tt.setup(job, &obs)
			tt.check(t, decide(job, obs, trainingv1alpha1.GangNone))
		})
	}
}

// Before the gang exists: Volcano missing holds it, a gang that can never
// fit fails or waits as whenNeverFits says, and a PodGroup Volcano has not
// admitted holds the pods.
func TestDecideBeforeTheGang(t *testing.T) {
	now := time.Now()
	never := inventory.FitResult{Verdict: inventory.Never, Message: "needs 16 GPUs per pod, none with more than 8"}
	tests := []struct {
		name      string
		sched     trainingv1alpha1.GangScheduler
		fail      bool
		obs       observed
		state     trainingv1alpha1.JobState
		creates   int
		scheduled string // the Scheduled condition's reason
	}{
		{"volcano missing", trainingv1alpha1.GangVolcano, false, observed{}, trainingv1alpha1.StateHeld, 0, ReasonPodsPending},
		{"never fits, fail", trainingv1alpha1.GangNone, true, observed{fit: never}, trainingv1alpha1.StateFailed, 0, ReasonPodsPending},
		{"never fits, wait", trainingv1alpha1.GangNone, false, observed{fit: never}, trainingv1alpha1.StatePending, 2, ReasonNeverFits},
		{"PodGroup not admitted", trainingv1alpha1.GangVolcano, false, observed{volcano: true}, trainingv1alpha1.StatePending, 0, ReasonGangPending},
		{"PodGroup admitted", trainingv1alpha1.GangVolcano, false, observed{volcano: true, podGroup: &schedulingv1beta1.PodGroup{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelAttempt: "0"}},
			Status:     schedulingv1beta1.PodGroupStatus{Phase: schedulingv1beta1.PodGroupInqueue}}}, trainingv1alpha1.StatePending, 2, ReasonGangInqueue},
		{"queue missing", trainingv1alpha1.GangVolcano, false, observed{volcano: true, queue: gang.CheckQueue("research", nil)},
			trainingv1alpha1.StatePending, 0, gang.ReasonQueueNotFound},
		{"queue closed", trainingv1alpha1.GangVolcano, false, observed{volcano: true, queue: gang.QueueProblem{Reason: gang.ReasonQueueClosed, Message: "closed"}},
			trainingv1alpha1.StatePending, 0, gang.ReasonQueueClosed},
		{"queue closed after admission: no matter", trainingv1alpha1.GangVolcano, false, observed{volcano: true,
			queue: gang.QueueProblem{Reason: gang.ReasonQueueClosed, Message: "closed"}, podGroup: &schedulingv1beta1.PodGroup{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelAttempt: "0"}},
				Status:     schedulingv1beta1.PodGroupStatus{Phase: schedulingv1beta1.PodGroupInqueue}}}, trainingv1alpha1.StatePending, 2, ReasonGangInqueue},
		{"gang larger than the cluster, fail: waits", trainingv1alpha1.GangNone, true, observed{fit: inventory.FitResult{Verdict: inventory.NotNow,
			Message: "needs 8 more GPUs than the cluster has (32 on 4 nodes)"}}, trainingv1alpha1.StatePending, 2, ReasonNotEnoughGPUs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := newJob("ns", "j", 1, 16, tt.sched)
			if tt.fail {
				job.Spec.Gang.WhenNeverFits = trainingv1alpha1.NeverFitsFail
			}
			tt.obs.now = now
			d := decide(job, tt.obs, trainingv1alpha1.GangNone)
			sc := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionScheduled)
			if d.status.State != tt.state || len(d.create) != tt.creates || sc == nil || sc.Reason != tt.scheduled {
				t.Fatalf("state %s creates %d Scheduled %+v; want %s, %d, %s", d.status.State, len(d.create), sc, tt.state, tt.creates, tt.scheduled)
			}
			if tt.sched == trainingv1alpha1.GangVolcano && tt.obs.volcano && (d.podGroup == nil || len(d.children) != 1) {
				t.Fatalf("PodGroup %v children %d", d.podGroup != nil, len(d.children))
			}
		})
	}
}

func TestUrgent(t *testing.T) {
	running := trainingv1alpha1.TrainingJobStatus{State: trainingv1alpha1.StateRunning}
	tests := []struct {
		name string
		d    decision
		want bool
	}{
		{"counts only", decision{status: running}, false},
		{"a restart", decision{status: running, restarted: true}, true},
		{"a new state", decision{status: trainingv1alpha1.TrainingJobStatus{State: trainingv1alpha1.StatePending}}, true},
		{"an end", decision{status: trainingv1alpha1.TrainingJobStatus{State: trainingv1alpha1.StateSucceeded}}, true},
	}
	for _, tt := range tests {
		job := &trainingv1alpha1.TrainingJob{Status: running}
		if got := urgent(job, &tt.d); got != tt.want {
			t.Errorf("%s: urgent = %v", tt.name, got)
		}
	}
	// A job's first pass writes its status once, after its pods, unless it
	// deletes a pod (a stale copy's pass must fail its write first) or ends.
	fresh := &trainingv1alpha1.TrainingJob{}
	pending := trainingv1alpha1.TrainingJobStatus{State: trainingv1alpha1.StatePending}
	for _, tt := range []struct {
		name string
		d    decision
		want bool
	}{
		{"first pass", decision{status: pending}, false},
		{"first pass that deletes", decision{status: pending, remove: []*corev1.Pod{{}}}, true},
		{"first pass that ends", decision{status: trainingv1alpha1.TrainingJobStatus{State: trainingv1alpha1.StateFailed}}, true},
	} {
		if got := urgent(fresh, &tt.d); got != tt.want {
			t.Errorf("%s: urgent = %v", tt.name, got)
		}
	}
}

func TestApplied(t *testing.T) {
	now := time.Now()
	st := trainingv1alpha1.TrainingJobStatus{}
	applied(&st, nil, 1, now)
	if len(st.Conditions) != 0 {
		t.Fatalf("a successful apply changed the status: %+v", st.Conditions)
	}
	applied(&st, errors.New(`pods "j-master-0" is forbidden: exceeded quota`), 1, now)
	for _, typ := range []string{trainingv1alpha1.ConditionCreated, trainingv1alpha1.ConditionReady} {
		c := meta.FindStatusCondition(st.Conditions, typ)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonCreateFailed || !strings.Contains(c.Message, "exceeded quota") {
			t.Fatalf("%s = %+v", typ, c)
		}
	}
}

// Once Volcano admits the gang (Inqueue), its own reason why the pods are
// not placed stays in the message while it applies, and drops out once a
// Scheduled condition follows it.
func TestInqueueMessage(t *testing.T) {
	now := time.Now()
	t0, t1 := metav1.NewTime(now.Add(-time.Minute)), metav1.NewTime(now)
	unsched := schedulingv1beta1.PodGroupCondition{Type: schedulingv1beta1.PodGroupUnschedulableType, Status: corev1.ConditionTrue,
		Reason: "NotEnoughResources", Message: "Insufficient nvidia.com/gpu", LastTransitionTime: t0}
	scheduled := schedulingv1beta1.PodGroupCondition{Type: schedulingv1beta1.PodGroupScheduled, Status: corev1.ConditionTrue, LastTransitionTime: t1}
	tests := []struct {
		name  string
		conds []schedulingv1beta1.PodGroupCondition
		want  bool // the message quotes Volcano's reason
	}{
		{"unschedulable while Inqueue", []schedulingv1beta1.PodGroupCondition{unsched}, true},
		{"scheduled since", []schedulingv1beta1.PodGroupCondition{unsched, scheduled}, false},
		{"no conditions", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := newJob("ns", "j", 1, 8, trainingv1alpha1.GangVolcano)
			pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelAttempt: "0"}},
				Status: schedulingv1beta1.PodGroupStatus{Phase: schedulingv1beta1.PodGroupInqueue, Conditions: tt.conds}}
			d := decide(job, observed{volcano: true, podGroup: pg, now: now}, trainingv1alpha1.GangNone)
			sc := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionScheduled)
			if sc == nil || sc.Reason != ReasonGangInqueue || strings.Contains(sc.Message, "Insufficient nvidia.com/gpu") != tt.want {
				t.Fatalf("Scheduled = %+v, quoting Volcano: want %v", sc, tt.want)
			}
		})
	}
}

// A waiting job's status holds while GPUs elsewhere are allocated and freed
// (nothing to write; only the pending gauges follow), and changes when its
// verdict does: it fits now, or the cluster shrinks below it.
func TestWaitingStatusIgnoresChurn(t *testing.T) {
	x := inventory.NewIndex()
	node := func(name string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		n.Status.Allocatable = corev1.ResourceList{inventory.GPUResource: *resource.NewQuantity(8, resource.DecimalSI)}
		n.Status.Capacity = n.Status.Allocatable
		return n
	}
	for _, n := range []string{"n0", "n1", "n2", "n3"} {
		x.SetNode(node(n))
	}
	busy := func(gpus ...int64) {
		for i := range 4 {
			x.DeletePod(types.UID(fmt.Sprintf("other-%d", i)))
		}
		for i, n := range gpus {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("other-%d", i), UID: types.UID(fmt.Sprintf("other-%d", i))},
				Spec: corev1.PodSpec{NodeName: fmt.Sprintf("n%d", i), Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{inventory.GPUResource: *resource.NewQuantity(n, resource.DecimalSI)}}}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			x.SetPod(p)
		}
	}
	job := newJob("ns", "j", 1, 8, trainingv1alpha1.GangNone) // 2 pods × 8 GPUs
	now := time.Now()
	pass := func() (decision, inventory.FitResult) {
		t.Helper()
		now = now.Add(5 * time.Second)
		_, g := gangGPUs(job)
		fit := x.Fits(g)
		return decide(job, observed{now: now, fit: fit}, trainingv1alpha1.GangNone), fit
	}
	busy(8, 8, 8, 2)
	d, _ := pass()
	job.Status = d.status
	for _, gpus := range [][]int64{{8, 8, 8, 8}, {8, 8, 8, 1}, {8, 4, 8, 8}, {1, 8, 8, 8}} {
		busy(gpus...)
		d, fit := pass()
		if !equality.Semantic.DeepEqual(d.status, job.Status) {
			t.Fatalf("busy %v: the status moved with the free GPUs:\n got %+v\nwant %+v", gpus, d.status.Conditions, job.Status.Conditions)
		}
		if !waiting(&d.status, fit) || fit.Units != 16 || fit.Free != 8*4-sum(gpus) {
			t.Fatalf("busy %v: waiting %v, units %d, free %d", gpus, waiting(&d.status, fit), fit.Units, fit.Free)
		}
	}
	busy(8, 8)
	if d, _ := pass(); countsOnly(&job.Status, &d.status) {
		t.Fatalf("two nodes free: the verdict (fits now) is not written as a change of reason: %+v", d.status.Conditions)
	}
	busy(8, 8, 8, 8)
	for _, n := range []string{"n1", "n2", "n3"} {
		x.DeleteNode(n)
	}
	d, _ = pass()
	sc := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionScheduled)
	if equality.Semantic.DeepEqual(d.status, job.Status) || !strings.Contains(sc.Message, "it fits once nodes are added") {
		t.Fatalf("a cluster smaller than the gang: Scheduled %+v", sc)
	}
}

func sum(v []int64) (n int64) {
	for _, x := range v {
		n += x
	}
	return n
}

// A pod placed but held by its kubelet for good (an image that cannot be
// pulled, a missing Secret) leaves the gang waiting without end: Ready and
// Running say which pod and why, not only how many pods run.
func TestStatusSaysWhyAPodDoesNotStart(t *testing.T) {
	now := time.Now()
	job := newJob("ns", "j", 2, 0, trainingv1alpha1.GangNone)
	job.UID = "job-uid"
	d := decide(job, observed{now: now, fit: inventory.FitResult{Verdict: inventory.FitsNow}}, trainingv1alpha1.GangNone)
	pods := d.create
	for _, p := range pods {
		p.UID = types.UID(p.Name)
		p.Spec.NodeName = "n"
		p.Status.Phase = corev1.PodRunning
	}
	waiting := func(p *corev1.Pod, reason, msg string) {
		p.Status.Phase = corev1.PodPending
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}}
	}
	waiting(pods[1], "ContainerCreating", "")
	waiting(pods[2], "ImagePullBackOff", `Back-off pulling image "pytorch:nope"`)
	job.Status = d.status
	d = decide(job, observed{pods: pods, now: now.Add(time.Minute)}, trainingv1alpha1.GangNone)
	want := `pod j-worker-1: container pytorch waits: ImagePullBackOff: Back-off pulling image "pytorch:nope"`
	for _, typ := range []string{trainingv1alpha1.ConditionReady, trainingv1alpha1.ConditionRunning} {
		c := meta.FindStatusCondition(d.status.Conditions, typ)
		if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "1 of 3 pods run; "+want) {
			t.Fatalf("%s = %+v; want it to say %q", typ, c, want)
		}
	}
	// The first pod by name that is held says why; a pod being created
	// says nothing.
	waiting(pods[1], "CreateContainerConfigError", `secret "hf-token" not found`)
	d = decide(job, observed{pods: pods, now: now.Add(2 * time.Minute)}, trainingv1alpha1.GangNone)
	if c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionReady); !strings.HasSuffix(c.Message, `pod j-worker-0: container pytorch waits: CreateContainerConfigError: secret "hf-token" not found`) {
		t.Fatalf("Ready = %+v", c)
	}
	waiting(pods[1], "ContainerCreating", "")
	waiting(pods[2], "ContainerCreating", "")
	d = decide(job, observed{pods: pods, now: now.Add(3 * time.Minute)}, trainingv1alpha1.GangNone)
	if c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionReady); c.Message != "1 of 3 pods run" {
		t.Fatalf("Ready = %+v while the containers are created", c)
	}
	// A partial gang's pod that Volcano has not placed, after the gang
	// was scheduled: the scheduler's words.
	unplaced := pods[2].DeepCopy()
	unplaced.Spec.NodeName, unplaced.Status.ContainerStatuses = "", nil
	unplaced.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/4 nodes are available: 4 Insufficient nvidia.com/gpu"}}
	if got := podset.WaitingWhy(unplaced); got != "not placed: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu" {
		t.Fatalf("an unplaced pod: %q", got)
	}
}

// After the restart the new attempt's pod of a lost node's pod cannot be
// made until the old one is gone: Scheduled and Ready say so, and how to
// end the wait.
func TestDecideNamesThePodTheNewGangWaitsFor(t *testing.T) {
	now := time.Now()
	job, pods := runningGang(t, now)
	ts := metav1.NewTime(now)
	pods[1].DeletionTimestamp = &ts
	d := decide(job, observed{pods: pods, now: now, fit: inventory.FitResult{Verdict: inventory.FitsNow}}, trainingv1alpha1.GangNone)
	if !d.restarted {
		t.Fatalf("setup: not restarted")
	}
	job.Status = d.status
	d = decide(job, observed{pods: pods[1:], now: now.Add(time.Minute), fit: inventory.FitResult{Verdict: inventory.FitsNow}}, trainingv1alpha1.GangNone)
	if len(d.create) != 1 || d.create[0].Name != "j-master-0" {
		t.Fatalf("creates %s; want only j-master-0", podNames(d.create))
	}
	want := "pod j-worker-0 of attempt 0 is still being deleted (since " + ts.UTC().Format(time.RFC3339) + ", on node n)"
	for _, typ := range []string{trainingv1alpha1.ConditionScheduled, trainingv1alpha1.ConditionReady} {
		if c := meta.FindStatusCondition(d.status.Conditions, typ); c == nil || !strings.Contains(c.Message, want) || !strings.Contains(c.Message, "--grace-period=0 --force") {
			t.Fatalf("%s = %+v; want it to say %q", typ, c, want)
		}
	}
}

// A job suspended (by runPolicy.suspend or Kueue) while its gang restarts
// has not finished: Restarting says it is suspended.
func TestSuspendingARestartingGangSaysSo(t *testing.T) {
	now := time.Now()
	job, pods := runningGang(t, now)
	pods[1].Status.Phase = corev1.PodFailed
	pods[1].Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}}}
	d := decide(job, observed{pods: pods, now: now}, trainingv1alpha1.GangNone)
	if d.status.State != trainingv1alpha1.StateRestarting {
		t.Fatalf("setup: state %s", d.status.State)
	}
	job.Status = d.status
	job.Spec.RunPolicy.Suspend = true
	d = decide(job, observed{now: now.Add(time.Second)}, trainingv1alpha1.GangNone)
	c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionRestarting)
	if d.status.State != trainingv1alpha1.StateSuspended || c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonSuspended || strings.Contains(c.Message, "finished") {
		t.Fatalf("state %s Restarting %+v; want False, reason %s", d.status.State, c, ReasonSuspended)
	}
}

// Preemptions, evictions and lost nodes are not the job's failures: a job
// preempted four times with backoffLimit 3 runs again, and then still has
// its three restarts for failures of its own (batch/v1 Job's
// podFailurePolicy with DisruptionTarget: Ignore; the Training Operator
// counts only failures). status.restarts counts them all, and
// status.disruptions those.
func TestDisruptionsDoNotSpendTheBackoffLimit(t *testing.T) {
	now := time.Now()
	job, _ := runningGang(t, now)
	job.Spec.RunPolicy.BackoffLimit = ptr(int32(3))
	// next takes the job through its restart until the new gang runs.
	next := func(d decision) {
		t.Helper()
		job.Status = d.status
		d = decide(job, observed{now: now, fit: inventory.FitResult{Verdict: inventory.FitsNow}}, trainingv1alpha1.GangNone)
		for _, p := range d.create {
			p.UID = types.UID(p.Name)
			p.Spec.NodeName = "n"
			p.Status.Phase = corev1.PodRunning
		}
		job.Status = d.status
		d = decide(job, observed{pods: d.create, now: now}, trainingv1alpha1.GangNone)
		if d.status.State != trainingv1alpha1.StateRunning {
			t.Fatalf("the restarted gang: state %s", d.status.State)
		}
		job.Status = d.status
	}
	disruptions := []func(pods []*corev1.Pod){
		func(pods []*corev1.Pod) { // preempted by the scheduler: SIGTERM, then Failed
			pods[1].Status.Phase = corev1.PodFailed
			pods[1].Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 143}}}}
			pods[1].Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}}
		},
		func(pods []*corev1.Pod) { // evicted by the kubelet under node pressure
			pods[0].Status.Phase = corev1.PodFailed
			pods[0].Status.Reason = "Evicted"
			pods[0].Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "TerminationByKubelet"}}
		},
		func(pods []*corev1.Pod) { // a lost node's pod, deleted by the taint manager
			ts := metav1.NewTime(now)
			pods[1].DeletionTimestamp = &ts
			pods[1].Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByTaintManager"}}
		},
		func(pods []*corev1.Pod) { // a worker preempted, the master's collective broken by it
			pods[1].Status.Phase = corev1.PodFailed
			pods[1].Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}}
			pods[0].Status.Phase = corev1.PodFailed
			pods[0].Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 134}}}}
		},
		func(pods []*corev1.Pod) { // a worker preempted, the master exiting with a permanent code in the same pass
			pods[1].Status.Phase = corev1.PodFailed
			pods[1].Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}}
			pods[0].Status.Phase = corev1.PodFailed
			pods[0].Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}
		},
		func(pods []*corev1.Pod) { // a worker being deleted by a preemption, the master already failed with a permanent code
			ts := metav1.NewTime(now)
			pods[1].DeletionTimestamp = &ts
			pods[1].Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}}
			pods[0].Status.Phase = corev1.PodFailed
			pods[0].Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}
		},
	}
	// running are the current attempt's pods, running.
	running := func() []*corev1.Pod {
		var out []*corev1.Pod
		for _, role := range roles {
			for i := range replicas(job, role) {
				p := buildPod(job, frameworks[job.Spec.Framework], role, i, job.Status.Attempt, trainingv1alpha1.GangNone)
				p.UID = types.UID(p.Name)
				p.Spec.NodeName = "n"
				p.Status.Phase = corev1.PodRunning
				out = append(out, p)
			}
		}
		return out
	}
	for i, disrupt := range disruptions {
		pods := running()
		disrupt(pods)
		d := decide(job, observed{pods: pods, now: now}, trainingv1alpha1.GangNone)
		if !d.restarted || d.status.State != trainingv1alpha1.StateRestarting {
			c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionFailed)
			t.Fatalf("disruption %d: restarted %v state %s Failed %+v; want the gang restarted", i+1, d.restarted, d.status.State, c)
		}
		if d.status.Restarts != int32(i+1) || d.status.Disruptions != int32(i+1) {
			t.Fatalf("disruption %d: restarts %d disruptions %d", i+1, d.status.Restarts, d.status.Disruptions)
		}
		next(d)
	}
	// Three failures of its own still restart it; the fourth fails it.
	for i := range 4 {
		pods := running()
		pods[1].Status.Phase = corev1.PodFailed
		pods[1].Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}}}
		d := decide(job, observed{pods: pods, now: now}, trainingv1alpha1.GangNone)
		if i < 3 {
			if !d.restarted || d.status.Disruptions != int32(len(disruptions)) {
				t.Fatalf("failure %d: restarted %v disruptions %d", i+1, d.restarted, d.status.Disruptions)
			}
			next(d)
			continue
		}
		c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionFailed)
		if d.restarted || c == nil || c.Reason != ReasonBackoffLimit || !strings.Contains(c.Message, fmt.Sprintf("restarted 3 times for failures (and %d for disruptions)", len(disruptions))) {
			t.Fatalf("failure 4: restarted %v Failed %+v", d.restarted, c)
		}
	}
}

// A finished job's headless Service goes with its pods (the Training
// Operator deletes each pod's Service with the pod): nothing is left for
// it to resolve. cleanPodPolicy None keeps both. Once the cache no longer
// shows it, a pass writes nothing.
func TestAFinishedJobsServiceGoesWithItsPods(t *testing.T) {
	now := time.Now()
	for _, tt := range []struct {
		policy  trainingv1alpha1.CleanPodPolicy
		service bool
		want    bool
	}{
		{trainingv1alpha1.CleanPodRunning, true, true},
		{trainingv1alpha1.CleanPodAll, true, true},
		{trainingv1alpha1.CleanPodNone, true, false},
		{trainingv1alpha1.CleanPodRunning, false, false},
	} {
		job, pods := runningGang(t, now)
		job.Spec.RunPolicy.CleanPodPolicy = tt.policy
		obs := observed{pods: pods, now: now}
		if tt.service {
			obs.service = buildService(job, frameworks[job.Spec.Framework])
		}
		pods[0].Status.Phase = corev1.PodSucceeded
		d := decide(job, obs, trainingv1alpha1.GangNone)
		if d.status.State != trainingv1alpha1.StateSucceeded || d.removeService != tt.want {
			t.Fatalf("%s, Service %v: state %s removeService %v, want %v", tt.policy, tt.service, d.status.State, d.removeService, tt.want)
		}
		// The next pass, of the finished job.
		job.Status = d.status
		if d := decide(job, obs, trainingv1alpha1.GangNone); d.removeService != tt.want || len(d.children) != 0 {
			t.Fatalf("%s, Service %v, finished: removeService %v children %d", tt.policy, tt.service, d.removeService, len(d.children))
		}
	}
}
