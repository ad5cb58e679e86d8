package training

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

func TestBadSpecsAreRejectedWithReadableMessages(t *testing.T) {
	ns := namespace(t, "validation")
	two, neg := int32(2), int32(-1)
	tests := []struct {
		name   string
		mutate func(*trainingv1alpha1.TrainingJob)
		want   string
	}{
		{"two masters", func(j *trainingv1alpha1.TrainingJob) { j.Spec.ReplicaSpecs.Master.Replicas = &two }, "exactly one master"},
		{"negative workers", func(j *trainingv1alpha1.TrainingJob) { j.Spec.ReplicaSpecs.Worker.Replicas = &neg }, "should be greater than or equal to 0"},
		{"no containers", func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.ReplicaSpecs.Worker.Template.Spec.Containers = []corev1.Container{}
		}, "must list at least one container"},
		{"container restarts", func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.ReplicaSpecs.Master.Template.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		}, "restarts the whole gang"},
		{"minAvailable above the pods", func(j *trainingv1alpha1.TrainingJob) { m := int32(9); j.Spec.Gang.MinAvailable = &m }, "gang.minAvailable exceeds the job's pods"},
		{"exit code range reversed", func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.FailurePolicy.RetryableExitCodes = []trainingv1alpha1.ExitCodeRange{{Min: 200, Max: ptr(int32(130))}}
		}, "max must not be below min"},
		{"unknown scheduler", func(j *trainingv1alpha1.TrainingJob) { j.Spec.Gang.Scheduler = "kueue" }, `supported values: "volcano", "none"`},
		{"name not a DNS label", func(j *trainingv1alpha1.TrainingJob) { j.Name = "9lives" }, "must be a DNS-1035 label"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := newJob(ns, "bad", 3, 1, trainingv1alpha1.GangNone)
			tt.mutate(j)
			err := env.Client.Create(context.Background(), j)
			if err == nil {
				_ = env.Client.Delete(context.Background(), j)
				t.Fatal("accepted")
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to say %q", err, tt.want)
			}
		})
	}
	// A running gang cannot change shape; a suspended one can.
	running := newJob(ns, "shape", 2, 0, trainingv1alpha1.GangNone)
	create(t, running)
	running.Spec.ReplicaSpecs.Worker.Replicas = ptr(int32(3))
	if err := env.Client.Update(context.Background(), running); err == nil || !strings.Contains(err.Error(), "replicaSpecs can change only while the job is suspended") {
		t.Fatalf("resizing a running job: %v", err)
	}
	running = getJob(t, running)
	running.Spec.RunPolicy.Suspend = true
	if err := env.Client.Update(context.Background(), running); err != nil {
		t.Fatal(err)
	}
	running.Spec.ReplicaSpecs.Worker.Replicas = ptr(int32(3))
	if err := env.Client.Update(context.Background(), running); err != nil {
		t.Fatalf("resizing a suspended job: %v", err)
	}
	// The update that resumes may change them too (Kueue's admission adds
	// its flavour's node selector as it un-suspends); the next may not.
	running = getJob(t, running)
	running.Spec.RunPolicy.Suspend = false
	running.Spec.ReplicaSpecs.Master.Template.Spec.NodeSelector = map[string]string{"pool": "a"}
	if err := env.Client.Update(context.Background(), running); err != nil {
		t.Fatalf("resuming and changing the pods in one update: %v", err)
	}
	running.Spec.ReplicaSpecs.Master.Template.Spec.NodeSelector = map[string]string{"pool": "b"}
	if err := env.Client.Update(context.Background(), running); err == nil || !strings.Contains(err.Error(), "replicaSpecs can change only while the job is suspended") {
		t.Fatalf("changing the pods of a resumed job: %v", err)
	}

	// Nor its rendezvous settings, which every pod carries; spelling out
	// a default changes nothing and is taken; suspended, they may change.
	rdv := newJob(ns, "rendezvous", 2, 0, trainingv1alpha1.GangNone)
	create(t, rdv)
	for name, edit := range map[string]func(*trainingv1alpha1.TrainingJob){
		"masterPort": func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.PyTorch = &trainingv1alpha1.PyTorchSpec{MasterPort: 29500}
		},
		"nprocPerNode": func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.PyTorch = &trainingv1alpha1.PyTorchSpec{NprocPerNode: "4"}
		},
	} {
		j := getJob(t, rdv)
		edit(j)
		if err := env.Client.Update(context.Background(), j); err == nil || !strings.Contains(err.Error(), "framework and pytorch (masterPort, nprocPerNode) can change only while the job is suspended") {
			t.Fatalf("changing %s of a running job: %v", name, err)
		}
	}
	j := getJob(t, rdv)
	j.Spec.PyTorch = &trainingv1alpha1.PyTorchSpec{MasterPort: trainingv1alpha1.DefaultMasterPort}
	if err := env.Client.Update(context.Background(), j); err != nil {
		t.Fatalf("spelling out the default masterPort: %v", err)
	}
	j.Spec.RunPolicy.Suspend = true
	if err := env.Client.Update(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	j.Spec.PyTorch.MasterPort, j.Spec.PyTorch.NprocPerNode = 29500, "4"
	if err := env.Client.Update(context.Background(), j); err != nil {
		t.Fatalf("changing the rendezvous of a suspended job: %v", err)
	}

	// spec defaults: one master, backoffLimit 3, cleanPodPolicy Running.
	j = newJob(ns, "defaults", 2, 0, "")
	j.Spec.ReplicaSpecs.Master.Replicas = nil
	create(t, j)
	got := getJob(t, j)
	if *got.Spec.ReplicaSpecs.Master.Replicas != 1 || *got.Spec.RunPolicy.BackoffLimit != 3 || got.Spec.RunPolicy.CleanPodPolicy != trainingv1alpha1.CleanPodRunning ||
		got.Spec.Framework != trainingv1alpha1.FrameworkPyTorch || got.Spec.Gang.Queue != "default" {
		t.Fatalf("defaults not applied: %+v", got.Spec)
	}
}

func ptr[T any](v T) *T { return &v }

// A worker killed by a signal (137) restarts the whole gang; an exit code of
// 1 fails the job and the running pods are cleaned up.
func TestRetryableFailureRestartsTheWholeGangPermanentFailsIt(t *testing.T) {
	ns := namespace(t, "restart")
	startManager(t)
	job := newJob(ns, "llm", 2, 0, trainingv1alpha1.GangNone)
	create(t, job)

	pods := waitPods(t, job, 3, 0)
	setPods(t, pods, corev1.PodRunning, 0)
	got := waitState(t, job, trainingv1alpha1.StateRunning)
	if c := cond(got, trainingv1alpha1.ConditionReady); c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready = %+v while running", c)
	}

	setPods(t, pods[2:3], corev1.PodFailed, 137) // llm-worker-1
	pods = waitPods(t, job, 3, 1)
	got = getJob(t, job)
	if got.Status.Restarts != 1 || got.Status.Attempt != 1 {
		t.Fatalf("restarts %d attempt %d, want 1 and 1", got.Status.Restarts, got.Status.Attempt)
	}
	if c := cond(got, trainingv1alpha1.ConditionRestarting); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "llm-worker-1: container pytorch exited with code 137") {
		t.Fatalf("Restarting = %+v", c)
	}
	if got.Status.State != trainingv1alpha1.StateRestarting {
		t.Fatalf("state %s, want Restarting", got.Status.State)
	}

	setPods(t, pods, corev1.PodRunning, 0)
	got = waitState(t, job, trainingv1alpha1.StateRunning)
	if c := cond(got, trainingv1alpha1.ConditionRestarting); c.Status != metav1.ConditionFalse || c.Reason != ReasonRestartDone {
		t.Fatalf("Restarting after the gang runs again = %+v", c)
	}

	setPods(t, pods[1:2], corev1.PodFailed, 1) // llm-worker-0: a bug in the script
	got = waitState(t, job, trainingv1alpha1.StateFailed)
	if c := cond(got, trainingv1alpha1.ConditionFailed); c.Reason != ReasonPermanentFailure || !strings.Contains(c.Message, "llm-worker-0: container pytorch exited with code 1") {
		t.Fatalf("Failed = %+v", c)
	}
	if got.Status.CompletionTime == nil || got.Status.Restarts != 1 {
		t.Fatalf("completion %v restarts %d", got.Status.CompletionTime, got.Status.Restarts)
	}
	// cleanPodPolicy Running: the failed pod stays for its logs, the others go.
	testenv.Eventually(t, 20*time.Second, func() error {
		left := jobPods(t, job)
		if len(left) != 1 || left[0].Name != "llm-worker-0" {
			return fmt.Errorf("pods left: %v", names(left))
		}
		return nil
	})
}

func names(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func TestBackoffLimitIsHonoured(t *testing.T) {
	ns := namespace(t, "backoff")
	startManager(t)
	job := newJob(ns, "flaky", 1, 0, trainingv1alpha1.GangNone)
	job.Spec.RunPolicy.BackoffLimit = ptr(int32(1))
	job.Spec.RunPolicy.CleanPodPolicy = trainingv1alpha1.CleanPodAll
	create(t, job)

	pods := waitPods(t, job, 2, 0)
	setPods(t, pods[1:], corev1.PodFailed, 143)
	pods = waitPods(t, job, 2, 1)
	setPods(t, pods[:1], corev1.PodFailed, 137) // the master this time
	got := waitState(t, job, trainingv1alpha1.StateFailed)
	c := cond(got, trainingv1alpha1.ConditionFailed)
	if c.Reason != ReasonBackoffLimit || !strings.Contains(c.Message, "backoffLimit is 1") || got.Status.Restarts != 1 {
		t.Fatalf("Failed = %+v, restarts %d", c, got.Status.Restarts)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if left := jobPods(t, job); len(left) != 0 {
			return fmt.Errorf("cleanPodPolicy All left %v", names(left))
		}
		return nil
	})
}

// A pod of a running gang that disappears breaks the gang: it restarts.
func TestADeletedPodOfARunningGangRestartsIt(t *testing.T) {
	ns := namespace(t, "deleted")
	startManager(t)
	job := newJob(ns, "ddp", 3, 0, trainingv1alpha1.GangNone)
	create(t, job)
	pods := waitPods(t, job, 4, 0)
	setPods(t, pods, corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)
	if err := env.Client.Delete(context.Background(), &pods[2]); err != nil {
		t.Fatal(err)
	}
	waitPods(t, job, 4, 1)
	got := getJob(t, job)
	// The pass sees the pod being deleted, or already gone.
	c := cond(got, trainingv1alpha1.ConditionRestarting)
	seen := strings.Contains(c.Message, "pod ddp-worker-1 is being deleted") || strings.Contains(c.Message, "pod ddp-worker-1 disappeared")
	// Its containers did not fail: a disruption, not counted against
	// the backoff limit.
	if !seen || got.Status.Restarts != 1 || got.Status.Disruptions != 1 || !strings.Contains(c.Message, "not counted against runPolicy.backoffLimit") {
		t.Fatalf("Restarting = %+v restarts %d disruptions %d", c, got.Status.Restarts, got.Status.Disruptions)
	}
}

// A pod on a node that is lost is deleted (the taint manager, a drain) but
// no kubelet confirms it: it stays Terminating. The gang is broken from
// then on: it restarts at once, freeing the other pods' GPUs, and the new
// attempt's pod of that name waits until the old one is gone.
func TestAPodStuckTerminatingRestartsTheGang(t *testing.T) {
	ns := namespace(t, "lostnode")
	startManager(t)
	job := newJob(ns, "ddp", 2, 0, trainingv1alpha1.GangNone)
	create(t, job)
	pods := waitPods(t, job, 3, 0)
	ctx := context.Background()
	// ddp-worker-1 runs on the node that will be lost: bound, its
	// deletion waits for a kubelet (envtest has none; the other pods,
	// unbound, go at once).
	stuck := pods[2]
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: stuck.Name, Namespace: ns}, Target: corev1.ObjectReference{Kind: "Node", Name: "lost-node"}}
	if err := env.Client.SubResource("binding").Create(ctx, &stuck, b); err != nil {
		t.Fatal(err)
	}
	setPods(t, pods, corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)
	if err := env.Client.Delete(ctx, &stuck); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		got := getJob(t, job)
		if c := cond(got, trainingv1alpha1.ConditionRestarting); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "pod ddp-worker-1 is being deleted") || got.Status.Restarts != 1 {
			return fmt.Errorf("state %s restarts %d Restarting %+v; want the gang restarted", got.Status.State, got.Status.Restarts, c)
		}
		left := jobPods(t, job)
		for _, p := range left {
			if p.Name != stuck.Name && p.Labels[LabelAttempt] != "1" {
				return fmt.Errorf("pod %s of attempt %s is still there", p.Name, p.Labels[LabelAttempt])
			}
		}
		if len(left) != 3 {
			return fmt.Errorf("pods %v", names(left))
		}
		if c := cond(got, trainingv1alpha1.ConditionScheduled); !strings.Contains(c.Message, "pod ddp-worker-1 of attempt 0 is still being deleted") {
			return fmt.Errorf("Scheduled = %+v; want it to name the pod the new gang waits for", c)
		}
		return nil
	})
	// The node is gone for good: a person force-deletes the pod.
	if err := env.Client.Delete(ctx, &stuck, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	waitPods(t, job, 3, 1)
}

// A finished job's Service goes with its pods: nothing is left for it to
// resolve (the Training Operator deletes each pod's Service with the pod).
func TestAFinishedJobsServiceGoes(t *testing.T) {
	ns := namespace(t, "finished-svc")
	startManager(t)
	job := newJob(ns, "done", 1, 0, trainingv1alpha1.GangNone)
	create(t, job)
	pods := waitPods(t, job, 2, 0)
	svc := &corev1.Service{}
	testenv.Eventually(t, 20*time.Second, func() error {
		return env.Client.Get(context.Background(), client.ObjectKeyFromObject(job), svc)
	})
	setPods(t, pods, corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)
	setPods(t, pods[:1], corev1.PodSucceeded, 0)
	waitState(t, job, trainingv1alpha1.StateSucceeded)
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(job), &corev1.Service{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the finished job's Service is still there (%v)", err)
		}
		return nil
	})
}

func TestSuccessSuspendResumeAndTTL(t *testing.T) {
	ns := namespace(t, "lifecycle")
	startManager(t)
	job := newJob(ns, "bert", 1, 0, trainingv1alpha1.GangNone)
	job.Spec.RunPolicy.TTLSecondsAfterFinished = ptr(int32(2))
	create(t, job)
	pods := waitPods(t, job, 2, 0)
	setPods(t, pods, corev1.PodRunning, 0)
	waitState(t, job, trainingv1alpha1.StateRunning)

	got := getJob(t, job)
	got.Spec.RunPolicy.Suspend = true
	if err := env.Client.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	waitState(t, job, trainingv1alpha1.StateSuspended)
	testenv.Eventually(t, 20*time.Second, func() error {
		if left := jobPods(t, job); len(left) != 0 {
			return fmt.Errorf("suspended job keeps pods %v", names(left))
		}
		return nil
	})

	got = getJob(t, job)
	got.Spec.RunPolicy.Suspend = false
	if err := env.Client.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	pods = waitPods(t, job, 2, 1)
	got = getJob(t, job)
	if got.Status.Restarts != 0 || cond(got, trainingv1alpha1.ConditionSuspended).Reason != ReasonResumed {
		t.Fatalf("after resume: restarts %d, Suspended %+v", got.Status.Restarts, cond(got, trainingv1alpha1.ConditionSuspended))
	}
	setPods(t, pods, corev1.PodRunning, 0)
	setPods(t, pods[1:], corev1.PodSucceeded, 0)
	setPods(t, pods[:1], corev1.PodSucceeded, 0)
	got = waitState(t, job, trainingv1alpha1.StateSucceeded)
	if c := cond(got, trainingv1alpha1.ConditionSucceeded); c.Status != metav1.ConditionTrue || got.Status.ReplicaStatuses.Master.Succeeded != 1 || got.Status.ReplicaStatuses.Worker.Succeeded != 1 {
		t.Fatalf("Succeeded = %+v, replicas %+v", c, got.Status.ReplicaStatuses)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(job), &trainingv1alpha1.TrainingJob{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("job still there 2s after finishing (err %v)", err)
		}
		return nil
	})
}

// Killing the manager while it creates a 64-worker gang leaves neither
// duplicates nor gaps after the restart.
func TestManagerRestartMidCreationLeavesExactlyTheGang(t *testing.T) {
	ns := namespace(t, "midcreate")
	slow := func(o *manager.Options) { o.KubeAPIQPS, o.KubeAPIBurst = 20, 1 }
	m := startManager(t, slow)
	job := newJob(ns, "big", 64, 0, trainingv1alpha1.GangNone)
	create(t, job)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := len(jobPods(t, job)); n < 5 {
			return fmt.Errorf("%d pods so far", n)
		}
		return nil
	})
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	before := len(jobPods(t, job))
	if before >= 65 {
		t.Fatalf("the manager finished creating before it was stopped (%d pods); the test needs it mid-way", before)
	}
	startManager(t)
	pods := waitPods(t, job, 65, 0)
	seen := map[string]bool{}
	for _, p := range pods {
		seen[p.Name] = true
	}
	for i := range 64 {
		if !seen[fmt.Sprintf("big-worker-%d", i)] {
			t.Fatalf("gap: big-worker-%d missing", i)
		}
	}
	time.Sleep(2 * time.Second)
	if n := len(jobPods(t, job)); n != 65 {
		t.Fatalf("%d pods after settling, want 65", n)
	}
	t.Logf("stopped the manager after %d of 65 pods; the restarted one completed the gang", before)
}

// With Volcano chosen and its CRDs absent the job is held without pods;
// once they are installed the job proceeds. Then the PodGroup and pods of a
// 1 master + 3 worker job with 8 GPUs each are checked field by field, and
// PodGroup phases moved by hand, as Volcano would, move the job.
func TestVolcano(t *testing.T) {
	ctx := context.Background()
	job, hog := volcanoJob(t)
	volcanoHeld(t, job)
	pg := volcanoPodGroup(ctx, t, job)
	volcanoQueue(ctx, t, job)
	volcanoPending(ctx, t, job, pg, hog)
	volcanoInqueue(ctx, t, job, pg)
	volcanoRunning(ctx, t, job, pg)
	volcanoNameConflict(ctx, t, job.Namespace)
}

// volcanoJob starts four simulated H100 nodes, one of which another pod
// holds, and a manager defaulting to Volcano, and submits the llama job.
func volcanoJob(t *testing.T) (*trainingv1alpha1.TrainingJob, *corev1.Pod) {
	ns := namespace(t, "volcano")
	for i := range 4 {
		runAgent(t, fmt.Sprintf("h100-%d", i), collect.SimOptions{System: "dgx-h100"})
	}
	// Something else holds 8 GPUs on one node: 24 of 32 are free.
	hog := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hog", Namespace: ns}, Spec: corev1.PodSpec{NodeName: "h100-0",
		Containers: []corev1.Container{{Name: "c", Image: "x", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{inventory.GPUResource: resource.MustParse("8")}}}}}}
	create(t, hog)
	create(t, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "train-high"}, Value: 1000})
	startManager(t, func(o *manager.Options) { o.GangScheduler = "volcano" })

	job := newJob(ns, "llama", 3, 8, "")
	job.Spec.Gang.Queue = "research"
	job.Spec.Gang.PriorityClassName = "train-high"
	job.Spec.ReplicaSpecs.Master.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	job.Spec.ReplicaSpecs.Worker.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("64Gi")}
	job.Spec.ReplicaSpecs.Worker.Template.Spec.InitContainers = []corev1.Container{{Name: "fetch", Image: "busybox",
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}
	create(t, job)
	return job, hog
}

// volcanoHeld: with Volcano's CRDs absent the job is held without pods.
func volcanoHeld(t *testing.T, job *trainingv1alpha1.TrainingJob) {
	got := waitState(t, job, trainingv1alpha1.StateHeld)
	if c := cond(got, trainingv1alpha1.ConditionCreated); c.Reason != ReasonVolcanoNotInstalled || !strings.Contains(c.Message, gang.CRDName) {
		t.Fatalf("Created = %+v", c)
	}
	if got.Status.Scheduler != trainingv1alpha1.GangVolcano {
		t.Fatalf("scheduler %q, want the manager's default volcano", got.Status.Scheduler)
	}
	time.Sleep(time.Second)
	if pods := jobPods(t, job); len(pods) != 0 {
		t.Fatalf("a held job created pods: %v", names(pods))
	}
}

// volcanoPodGroup installs Volcano's CRDs and checks the job's PodGroup.
func volcanoPodGroup(ctx context.Context, t *testing.T, job *trainingv1alpha1.TrainingJob) *schedulingv1beta1.PodGroup {
	if err := env.InstallCRDs(ctx, "scheduling.volcano.sh"); err != nil {
		t.Fatal(err)
	}
	pg := &schedulingv1beta1.PodGroup{}
	testenv.Eventually(t, 30*time.Second, func() error {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(job), pg)
	})
	if pg.Spec.MinMember != 4 || pg.Spec.MinTaskMember["master"] != 1 || pg.Spec.MinTaskMember["worker"] != 3 || pg.Spec.Queue != "research" || pg.Spec.PriorityClassName != "train-high" {
		t.Fatalf("PodGroup spec %+v", pg.Spec)
	}
	wantRes := map[corev1.ResourceName]string{"nvidia.com/gpu": "32", "cpu": "16", "memory": "256Gi"}
	for k, v := range wantRes {
		if q := (*pg.Spec.MinResources)[k]; q.Cmp(resource.MustParse(v)) != 0 {
			t.Fatalf("minResources[%s] = %s, want %s (all: %v)", k, q.String(), v, *pg.Spec.MinResources)
		}
	}
	if !metav1.IsControlledBy(pg, getJob(t, job)) {
		t.Fatalf("PodGroup not controlled by the job: %v", pg.OwnerReferences)
	}
	return pg
}

// volcanoQueue: the job's queue is missing, then closed, then open; the
// Scheduled condition says each, following the Queue without a change to
// the job.
func volcanoQueue(ctx context.Context, t *testing.T, job *trainingv1alpha1.TrainingJob) {
	scheduled := func(reason, msg string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func() error {
			if c := cond(getJob(t, job), trainingv1alpha1.ConditionScheduled); c.Reason != reason || !strings.Contains(c.Message, msg) {
				return fmt.Errorf("Scheduled = %+v, want %s containing %q", c, reason, msg)
			}
			return nil
		})
	}
	scheduled(gang.ReasonQueueNotFound, `Volcano queue "research" does not exist`)
	if c := cond(getJob(t, job), trainingv1alpha1.ConditionReady); c.Reason != gang.ReasonQueueNotFound {
		t.Fatalf("Ready = %+v", c)
	}
	q := &schedulingv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "research"}, Spec: schedulingv1beta1.QueueSpec{Weight: 1}}
	create(t, q)
	q.Status.State = schedulingv1beta1.QueueStateClosed
	if err := env.Client.Status().Update(ctx, q); err != nil {
		t.Fatal(err)
	}
	scheduled(gang.ReasonQueueClosed, `Volcano queue "research" is Closed`)
	q.Status.State = schedulingv1beta1.QueueStateOpen
	if err := env.Client.Status().Update(ctx, q); err != nil {
		t.Fatal(err)
	}
	scheduled(ReasonNotEnoughGPUs, "PodGroup llama waits for Volcano to admit it to queue research")
}

// volcanoPending moves the PodGroup to Pending and unschedulable as Volcano
// would, then frees the hog's GPUs.
func volcanoPending(ctx context.Context, t *testing.T, job *trainingv1alpha1.TrainingJob, pg *schedulingv1beta1.PodGroup, hog *corev1.Pod) {
	// Pending and unschedulable, as Volcano reports it: both explanations.
	pg.Status.Phase = schedulingv1beta1.PodGroupPending
	pg.Status.Conditions = []schedulingv1beta1.PodGroupCondition{{Type: schedulingv1beta1.PodGroupUnschedulableType, Status: corev1.ConditionTrue,
		Reason: "NotEnoughResources", Message: "4/4 tasks in gang unschedulable: pod group is not ready, 4 Pending, 4 minAvailable", LastTransitionTime: metav1.Now()}}
	if err := env.Client.Update(ctx, pg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		c := cond(getJob(t, job), trainingv1alpha1.ConditionScheduled)
		if !strings.Contains(c.Message, "Volcano: NotEnoughResources: 4/4 tasks in gang unschedulable") ||
			!strings.Contains(c.Message, "inventory: needs 4 pods × 8 nvidia.com/gpu (32 in all): it fits the cluster once GPUs free up;") {
			return fmt.Errorf("Scheduled = %+v", c)
		}
		if c.Reason != ReasonNotEnoughGPUs {
			return fmt.Errorf("reason %s", c.Reason)
		}
		// The live numbers are the gauges', not the status's.
		if gpus, free, ok := pendingGauges(job); !ok || gpus != 32 || free != 24 {
			return fmt.Errorf("pending gauges %v %v %v, want 32 GPUs waited for, 24 free", ok, gpus, free)
		}
		return nil
	})
	if pods := jobPods(t, job); len(pods) != 0 {
		t.Fatalf("pods created before the gang was admitted: %v", names(pods))
	}

	// The GPUs come free: the verdict changes (it fits now) without any
	// change to the job, and the gauge follows.
	if err := env.Client.Delete(ctx, hog, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if c := cond(getJob(t, job), trainingv1alpha1.ConditionScheduled); c.Reason != ReasonGangPending || strings.Contains(c.Message, "inventory:") {
			return fmt.Errorf("still waits for GPUs: %+v", c)
		}
		if _, free, _ := pendingGauges(job); free != 32 {
			return fmt.Errorf("loom_trainingjob_pending_free_gpus %v, want 32", free)
		}
		return nil
	})
}

// volcanoInqueue admits the gang and checks its pods and Service.
func volcanoInqueue(ctx context.Context, t *testing.T, job *trainingv1alpha1.TrainingJob, pg *schedulingv1beta1.PodGroup) {
	// Inqueue: the pods are created, each one exactly so.
	pg.Status.Phase = schedulingv1beta1.PodGroupInqueue
	pg.Status.Conditions = nil
	if err := env.Client.Update(ctx, pg); err != nil {
		t.Fatal(err)
	}
	pods := waitPods(t, job, 4, 0)
	// The pass writes its status after its pods: the pods can be seen first.
	testenv.Eventually(t, 10*time.Second, func() error {
		if c := cond(getJob(t, job), trainingv1alpha1.ConditionScheduled); c.Reason != ReasonGangInqueue {
			return fmt.Errorf("Scheduled while Inqueue = %+v", c)
		}
		return nil
	})
	for i, p := range pods {
		role, rank := "worker", i
		if p.Name == "llama-master-0" {
			role, rank = "master", 0
		}
		checkPod(t, &p, role, rank)
	}
	svc := &corev1.Service{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: "llama"}, svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || svc.Spec.Selector[LabelJobName] != "llama" ||
		len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 23456 || svc.Spec.Ports[0].Name != PortName {
		t.Fatalf("Service %+v", svc.Spec)
	}
}

// volcanoRunning: the PodGroup running schedules the gang, and a
// hand-edited PodGroup is put back.
func volcanoRunning(ctx context.Context, t *testing.T, job *trainingv1alpha1.TrainingJob, pg *schedulingv1beta1.PodGroup) {
	// Running: the gang is scheduled.
	pg.Status.Phase = schedulingv1beta1.PodGroupRunning
	if err := env.Client.Update(ctx, pg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if c := cond(getJob(t, job), trainingv1alpha1.ConditionScheduled); c.Status != metav1.ConditionTrue || c.Reason != ReasonGangScheduled {
			return fmt.Errorf("Scheduled = %+v", c)
		}
		return nil
	})
	got := getJob(t, job)
	if got.Status.GPUs != 32 || got.Status.Workers != 3 {
		t.Fatalf("status gpus %d workers %d", got.Status.GPUs, got.Status.Workers)
	}

	// A hand-edited PodGroup is put back.
	pg = &schedulingv1beta1.PodGroup{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), pg); err != nil {
		t.Fatal(err)
	}
	pg.Spec.MinMember = 1
	if err := env.Client.Update(ctx, pg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), pg); err != nil {
			return err
		}
		if pg.Spec.MinMember != 4 {
			return fmt.Errorf("minMember %d", pg.Spec.MinMember)
		}
		return nil
	})
}

// volcanoNameConflict: a job one of whose names a user's object holds
// (its Service's, a pod's) says NameConflict and gets no PodGroup, which
// Volcano would enqueue, reserving its queue's resources for a gang that
// cannot start; once the name is free it gets one.
func volcanoNameConflict(ctx context.Context, t *testing.T, ns string) {
	for _, tt := range []struct {
		job      string
		stranger client.Object
		says     string
	}{
		{"svc", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc", Namespace: ns},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, "Service " + ns + "/svc exists"},
		{"pod", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-master-0", Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, "pod pod-master-0 exists and is not controlled by pod"},
	} {
		create(t, tt.stranger)
		job := newJob(ns, tt.job, 1, 0, trainingv1alpha1.GangVolcano)
		create(t, job)
		testenv.Eventually(t, 20*time.Second, func() error {
			if c := cond(getJob(t, job), trainingv1alpha1.ConditionReady); c.Reason != ReasonNameConflict || !strings.Contains(c.Message, tt.says) {
				return fmt.Errorf("Ready = %+v", c)
			}
			return nil
		})
		time.Sleep(time.Second)
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), &schedulingv1beta1.PodGroup{}); !apierrors.IsNotFound(err) {
			t.Fatalf("%s: a job stopped by a name conflict has a PodGroup (%v)", tt.job, err)
		}
		if err := env.Client.Delete(ctx, tt.stranger, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, func() error {
			return env.Client.Get(ctx, client.ObjectKeyFromObject(job), &schedulingv1beta1.PodGroup{})
		})
	}
}

// checkPod checks one pod of the llama job.
func checkPod(t *testing.T, p *corev1.Pod, role string, rank int) {
	t.Helper()
	idx := rank
	if role == "worker" {
		idx = rank - 1
	}
	if want := fmt.Sprintf("llama-%s-%d", role, idx); p.Name != want {
		t.Fatalf("pod %s, want %s", p.Name, want)
	}
	wantLabels := map[string]string{LabelJobName: "llama", LabelReplicaType: role, LabelReplicaIndex: fmt.Sprint(idx), LabelAttempt: "0"}
	if role == "master" {
		wantLabels[LabelJobRole] = "master"
	}
	for k, v := range wantLabels {
		if p.Labels[k] != v {
			t.Fatalf("%s: label %s=%q, want %q", p.Name, k, p.Labels[k], v)
		}
	}
	if role == "worker" {
		if _, ok := p.Labels[LabelJobRole]; ok {
			t.Fatalf("%s: a worker carries %s", p.Name, LabelJobRole)
		}
	}
	if p.Spec.SchedulerName != "volcano" || p.Annotations[gang.GroupNameAnnotation] != "llama" || p.Annotations[gang.TaskSpecAnnotation] != role {
		t.Fatalf("%s: scheduler %q annotations %v", p.Name, p.Spec.SchedulerName, p.Annotations)
	}
	if p.Spec.Hostname != p.Name || p.Spec.Subdomain != "llama" || p.Spec.RestartPolicy != corev1.RestartPolicyNever || p.Spec.PriorityClassName != "train-high" {
		t.Fatalf("%s: hostname %q subdomain %q restart %q priority %q", p.Name, p.Spec.Hostname, p.Spec.Subdomain, p.Spec.RestartPolicy, p.Spec.PriorityClassName)
	}
	if len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Kind != "TrainingJob" || p.OwnerReferences[0].Controller == nil || !*p.OwnerReferences[0].Controller {
		t.Fatalf("%s: owner %v", p.Name, p.OwnerReferences)
	}
	env := map[string]string{}
	for _, e := range p.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	want := map[string]string{
		"MASTER_ADDR": "llama-master-0.llama", "MASTER_PORT": "23456", "WORLD_SIZE": "32", "RANK": fmt.Sprint(rank),
		"PYTHONUNBUFFERED": "1", "PET_MASTER_ADDR": "llama-master-0.llama", "PET_MASTER_PORT": "23456",
		"PET_NNODES": "4", "PET_NODE_RANK": fmt.Sprint(rank), "PET_NPROC_PER_NODE": "8",
	}
	for k, v := range want {
		if env[k] != v {
			t.Fatalf("%s: %s=%q, want %q (env %v)", p.Name, k, env[k], v, env)
		}
	}
	hasPort := false
	for _, port := range p.Spec.Containers[0].Ports {
		hasPort = hasPort || (port.Name == PortName && port.ContainerPort == 23456)
	}
	if hasPort != (role == "master") {
		t.Fatalf("%s: ports %v", p.Name, p.Spec.Containers[0].Ports)
	}
}

// A gang asking more GPUs per pod than any node has says it can never fit;
// told to fail fast, it fails without creating a pod.
func TestAGangThatCanNeverFitSaysSo(t *testing.T) {
	ns := namespace(t, "neverfits")
	runAgent(t, "a100-0", collect.SimOptions{System: "dgx-a100"})
	startManager(t)
	wait := newJob(ns, "huge", 1, 16, trainingv1alpha1.GangNone)
	create(t, wait)
	testenv.Eventually(t, 30*time.Second, func() error {
		c := cond(getJob(t, wait), trainingv1alpha1.ConditionScheduled)
		if c.Reason != ReasonNeverFits || !strings.Contains(c.Message, "none with more than 8") || !strings.Contains(c.Message, "it can never fit") {
			return fmt.Errorf("Scheduled = %+v", c)
		}
		return nil
	})
	if got := getJob(t, wait); got.Status.State != trainingv1alpha1.StatePending {
		t.Fatalf("a waiting never-fitting gang is %s", got.Status.State)
	}

	fast := newJob(ns, "huge-fast", 1, 16, trainingv1alpha1.GangNone)
	fast.Spec.Gang.WhenNeverFits = trainingv1alpha1.NeverFitsFail
	create(t, fast)
	got := waitState(t, fast, trainingv1alpha1.StateFailed)
	if c := cond(got, trainingv1alpha1.ConditionFailed); c.Reason != ReasonNeverFits || !strings.Contains(c.Message, "gang.whenNeverFits: Fail") {
		t.Fatalf("Failed = %+v", c)
	}
	if pods := jobPods(t, fast); len(pods) != 0 {
		t.Fatalf("a gang that can never fit created pods %v", names(pods))
	}
}
