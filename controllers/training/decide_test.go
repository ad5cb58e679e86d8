package training

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
)

func failedPod(job *trainingv1alpha1.TrainingJob, role trainingv1alpha1.Role, i int32, code int32, reason string) *corev1.Pod {
	p := buildPod(job, pytorch{}, role, i, 0, trainingv1alpha1.GangNone)
	p.Status.Phase = corev1.PodFailed
	p.Status.Reason = reason
	if code != 0 {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error"}}}}
	}
	return p
}

// initFailed is a failed pod whose init container name (restart: its
// restart policy, nil unless a sidecar) exited with code; its container
// exited with main[0], else never started.
func initFailed(job *trainingv1alpha1.TrainingJob, name string, code int32, restart *corev1.ContainerRestartPolicy, main ...int32) *corev1.Pod {
	p := failedPod(job, "worker", 0, 0, "")
	p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: name, Image: "busybox", RestartPolicy: restart})
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error"}}}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}
	if len(main) > 0 {
		p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: main[0], Reason: "Error"}}
	}
	return p
}

func TestClassify(t *testing.T) {
	job := newJob("ns", "j", 2, 0, trainingv1alpha1.GangNone)
	custom := newJob("ns", "j", 2, 0, trainingv1alpha1.GangNone)
	custom.Spec.FailurePolicy.RetryableExitCodes = []trainingv1alpha1.ExitCodeRange{{Min: 1}, {Min: 200, Max: ptr(int32(210))}}
	tests := []struct {
		name      string
		job       *trainingv1alpha1.TrainingJob
		pod       *corev1.Pod
		retryable bool
		says      string
	}{
		{"SIGKILL / OOM kill", job, failedPod(job, "worker", 1, 137, ""), true, "exited with code 137 (Error, retryable)"},
		{"script error", job, failedPod(job, "worker", 0, 1, ""), false, "exited with code 1 (Error, permanent)"},
		{"127 command not found", job, failedPod(job, "master", 0, 127, ""), false, "code 127"},
		{"evicted", job, failedPod(job, "worker", 0, 0, "Evicted"), true, "failed: Evicted"},
		{"no exit code", job, failedPod(job, "worker", 0, 0, ""), true, "no container exit code"},
		{"custom: 1 retryable", custom, failedPod(custom, "worker", 0, 1, ""), true, "retryable"},
		{"custom: 137 now permanent", custom, failedPod(custom, "worker", 0, 137, ""), false, "permanent"},
		{"custom: inside a range", custom, failedPod(custom, "worker", 0, 205, ""), true, "retryable"},
		{"init container script error", job, initFailed(job, "fetch-data", 1, nil), false, "container fetch-data exited with code 1 (Error, permanent)"},
		{"init container OOM killed", job, initFailed(job, "fetch-data", 137, nil), true, "container fetch-data exited with code 137"},
		{"a sidecar stopped after the container failed", job, initFailed(job, "proxy", 143, ptr(corev1.ContainerRestartPolicyAlways), 1), false, "container pytorch exited with code 1"},
		{"only a sidecar's exit code", job, initFailed(job, "proxy", 1, ptr(corev1.ContainerRestartPolicyAlways)), true, "no container exit code"},
		{"a permanent exit listed after a retryable one", job, twoContainers(job, 137, 1), false, "container pytorch exited with code 1 (Error, permanent)"},
		{"a permanent exit listed before a retryable one", job, twoContainers(job, 1, 137), false, "container a-logger exited with code 1 (Error, permanent)"},
		{"two retryable exits: the first listed", job, twoContainers(job, 143, 137), true, "container a-logger exited with code 143"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := classify(tt.job, tt.pod)
			if f.retryable != tt.retryable || f.disrupted || !strings.Contains(f.why, tt.says) {
				t.Fatalf("classify = %+v, want retryable %v, no disruption and %q", f, tt.retryable, tt.says)
			}
		})
	}
	// The DisruptionTarget condition makes a failure a disruption, whatever
	// the exit code (a preempted pod's containers end on SIGTERM).
	for _, reason := range []string{"PreemptionByScheduler", "TerminationByKubelet", "DeletionByTaintManager", "EvictionByEvictionAPI", "DeletionByPodGC"} {
		disrupted := failedPod(job, "worker", 0, 1, "")
		disrupted.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: reason}}
		if f := classify(job, disrupted); !f.retryable || !f.disrupted || !strings.Contains(f.why, "disrupted ("+reason) {
			t.Fatalf("%s: classify = %+v, want a retryable disruption", reason, f)
		}
	}
}

// twoContainers is a failed worker whose containers a-logger and pytorch
// exited with these codes, listed by name as the kubelet lists them.
func twoContainers(job *trainingv1alpha1.TrainingJob, logger, main int32) *corev1.Pod {
	p := failedPod(job, "worker", 0, main, "")
	p.Spec.Containers = append([]corev1.Container{{Name: "a-logger", Image: "x"}}, p.Spec.Containers...)
	p.Status.ContainerStatuses = append([]corev1.ContainerStatus{{Name: "a-logger",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: logger, Reason: "Error"}}}}, p.Status.ContainerStatuses...)
	return p
}

func envOf(p *corev1.Pod) map[string]string {
	m := map[string]string{}
	for _, e := range p.Spec.Containers[0].Env {
		m[e.Name] = e.Value
	}
	return m
}

// WORLD_SIZE is the same in every pod, whatever each role requests.
func TestWorldSizeAgreesAcrossTheGang(t *testing.T) {
	for _, tc := range []struct {
		name               string
		workers            int32
		masterGPUs, worker int64
		nproc              string
		want               string
	}{
		{"alike", 2, 8, 8, "", "24"},
		{"a 1-GPU master beside 8-GPU workers", 2, 1, 8, "", "17"},
		{"a master without GPUs: auto", 2, 0, 8, "", "3"},
		{"nprocPerNode set for all", 2, 1, 8, "4", "12"},
		{"nprocPerNode auto", 3, 8, 8, "auto", "4"},
		{"the master alone", 0, 4, 0, "", "4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := newJob("ns", "j", tc.workers, tc.worker, trainingv1alpha1.GangNone)
			job.Spec.ReplicaSpecs.Master.Template = gpuTemplate(tc.masterGPUs)
			if tc.nproc != "" {
				job.Spec.PyTorch = &trainingv1alpha1.PyTorchSpec{NprocPerNode: tc.nproc}
			}
			d := decide(job, observed{now: time.Now(), fit: inventory.FitResult{Verdict: inventory.FitsNow}}, trainingv1alpha1.GangNone)
			if len(d.create) != int(tc.workers)+1 {
				t.Fatalf("created %d pods", len(d.create))
			}
			for _, p := range d.create {
				if got := envOf(p)["WORLD_SIZE"]; got != tc.want {
					t.Errorf("pod %s: WORLD_SIZE %s, want %s", p.Name, got, tc.want)
				}
			}
		})
	}
}

func TestPyTorchEnv(t *testing.T) {
	job := newJob("ns", "gpt", 3, 4, trainingv1alpha1.GangNone)
	w := buildPod(job, pytorch{}, trainingv1alpha1.RoleWorker, 2, 0, trainingv1alpha1.GangNone)
	e := envOf(w)
	if e["RANK"] != "3" || e["PET_NODE_RANK"] != "3" || e["WORLD_SIZE"] != "16" || e["PET_NNODES"] != "4" || e["PET_NPROC_PER_NODE"] != "4" {
		t.Fatalf("worker 2 env %v", e)
	}
	job.Spec.PyTorch = &trainingv1alpha1.PyTorchSpec{NprocPerNode: "auto", MasterPort: 29500}
	e = envOf(buildPod(job, pytorch{}, trainingv1alpha1.RoleMaster, 0, 0, trainingv1alpha1.GangNone))
	if e["WORLD_SIZE"] != "4" || e["PET_NPROC_PER_NODE"] != "auto" || e["MASTER_PORT"] != "29500" || e["RANK"] != "0" {
		t.Fatalf("master env with nproc auto %v", e)
	}
	// The user's own value wins.
	job.Spec.ReplicaSpecs.Master.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "MASTER_PORT", Value: "1234"}}
	p := buildPod(job, pytorch{}, trainingv1alpha1.RoleMaster, 0, 0, trainingv1alpha1.GangNone)
	n := 0
	for _, v := range p.Spec.Containers[0].Env {
		if v.Name == "MASTER_PORT" {
			n++
			if v.Value != "1234" {
				t.Fatalf("MASTER_PORT = %s", v.Value)
			}
		}
	}
	if n != 1 {
		t.Fatalf("MASTER_PORT set %d times", n)
	}
}

func TestPartialGangPodGroup(t *testing.T) {
	job := newJob("ns", "p", 7, 8, trainingv1alpha1.GangVolcano)
	job.Spec.Gang.MinAvailable = ptr(int32(5))
	pg := buildPodGroup(job, 0)
	if pg.Spec.MinMember != 5 || pg.Spec.MinTaskMember["master"] != 1 || pg.Spec.MinTaskMember["worker"] != 4 {
		t.Fatalf("partial gang %+v", pg.Spec)
	}
	if q := (*pg.Spec.MinResources)[inventory.GPUResource]; q.Value() != 40 {
		t.Fatalf("minResources GPUs %s, want 40", q.String())
	}
}

// decide is pure: the same inputs give the same decision, and a finished
// job never creates pods.
func TestDecideFinishedJobCreatesNothing(t *testing.T) {
	job := newJob("ns", "done", 2, 0, trainingv1alpha1.GangNone)
	job.Status.State = trainingv1alpha1.StateSucceeded
	now := time.Now()
	ct := metav1.NewTime(now.Add(-time.Minute))
	job.Status.CompletionTime = &ct
	job.Spec.RunPolicy.TTLSecondsAfterFinished = ptr(int32(30))
	running := buildPod(job, pytorch{}, trainingv1alpha1.RoleWorker, 0, 0, trainingv1alpha1.GangNone)
	running.Status.Phase = corev1.PodRunning
	d := decide(job, observed{pods: []*corev1.Pod{running}, now: now}, trainingv1alpha1.GangNone)
	if len(d.create) != 0 || !d.deleteJob || len(d.remove) != 1 || !d.removePodGroup {
		t.Fatalf("decision for a finished job: create %d deleteJob %v remove %d", len(d.create), d.deleteJob, len(d.remove))
	}
}

func TestDecideWaitsForTheOldGangBeforeCreatingTheNext(t *testing.T) {
	job := newJob("ns", "r", 1, 0, trainingv1alpha1.GangNone)
	job.Status.Attempt = 1
	old := buildPod(job, pytorch{}, trainingv1alpha1.RoleWorker, 0, 0, trainingv1alpha1.GangNone)
	ts := metav1.Now()
	old.DeletionTimestamp = &ts
	d := decide(job, observed{pods: []*corev1.Pod{old}, now: time.Now()}, trainingv1alpha1.GangNone)
	if len(d.create) != 1 || d.create[0].Name != "r-master-0" || d.create[0].Labels[LabelAttempt] != "1" {
		t.Fatalf("creates %v; want only r-master-0 of attempt 1 while r-worker-0 of attempt 0 terminates", d.create)
	}
}

// After a restart the previous attempt's PodGroup still says Running: it
// must not schedule the new gang; it is deleted and no pods are created.
func TestDecideIgnoresAnEarlierAttemptsPodGroup(t *testing.T) {
	job := newJob("ns", "v", 1, 0, trainingv1alpha1.GangVolcano)
	job.Status.Attempt = 1
	old := buildPodGroup(job, 0)
	old.Status.Phase = schedulingv1beta1.PodGroupRunning
	d := decide(job, observed{podGroup: old, volcano: true, now: time.Now()}, trainingv1alpha1.GangNone)
	if !d.removePodGroup || d.podGroup != nil || len(d.create) != 0 {
		t.Fatalf("stale PodGroup: remove %v apply %v creates %d", d.removePodGroup, d.podGroup != nil, len(d.create))
	}
	if c := cond(&trainingv1alpha1.TrainingJob{Status: d.status}, trainingv1alpha1.ConditionScheduled); c.Status == metav1.ConditionTrue {
		t.Fatalf("the new gang counted as scheduled by the old PodGroup: %+v", c)
	}
}

// An attempt's pods were built for one scheduler, and it stays the job's
// while they exist: Volcano installed under a job --gang-scheduler=auto
// started pod by pod does not split the gang between two schedulers; it
// takes effect with the next attempt. A job edited away from Volcano while
// it waited loses its PodGroup.
func TestSchedulerStaysForTheAttemptsPods(t *testing.T) {
	now := time.Now()
	fits := inventory.FitResult{Verdict: inventory.FitsNow}
	job := newJob("ns", "j", 1, 8, "")
	job.UID = "uid"
	d := decide(job, observed{now: now, fit: fits}, manager.GangAuto)
	if d.status.Scheduler != trainingv1alpha1.GangNone || len(d.create) != 2 {
		t.Fatalf("setup: scheduler %s, %d pods", d.status.Scheduler, len(d.create))
	}
	pods := d.create
	for _, p := range pods {
		p.UID = types.UID(p.Name)
	}
	job.Status = d.status
	d = decide(job, observed{volcano: true, pods: pods, now: now.Add(time.Second), fit: fits}, manager.GangAuto)
	if d.status.Scheduler != trainingv1alpha1.GangNone || d.podGroup != nil || len(d.remove) != 0 || len(d.create) != 0 {
		t.Fatalf("Volcano installed under the attempt's pods: scheduler %s, PodGroup %v, remove %d, create %d; want scheduler none and nothing done",
			d.status.Scheduler, d.podGroup != nil, len(d.remove), len(d.create))
	}
	// With its pods gone (the next attempt), the job is Volcano's.
	job.Status = d.status
	d = decide(job, observed{volcano: true, now: now.Add(2 * time.Second), fit: fits}, manager.GangAuto)
	if d.status.Scheduler != trainingv1alpha1.GangVolcano || d.podGroup == nil {
		t.Fatalf("no pods left: scheduler %s, PodGroup %v; want Volcano's", d.status.Scheduler, d.podGroup != nil)
	}

	// A job for no gang scheduler whose template names the user's own
	// PodGroup: its pods are not Loom's gang, and stay the job's own.
	own := newJob("ns", "own", 1, 8, trainingv1alpha1.GangNone)
	own.UID = "uid-own"
	for _, rs := range []*trainingv1alpha1.ReplicaSpec{&own.Spec.ReplicaSpecs.Master, own.Spec.ReplicaSpecs.Worker} {
		rs.Template.Annotations = map[string]string{gang.GroupNameAnnotation: "theirs"}
		rs.Template.Spec.SchedulerName = gang.SchedulerName
	}
	d = decide(own, observed{volcano: true, now: now, fit: fits}, manager.GangAuto)
	ownPods := d.create
	for _, p := range ownPods {
		p.UID = types.UID(p.Name)
	}
	own.Status = d.status
	d = decide(own, observed{volcano: true, pods: ownPods, now: now.Add(time.Second), fit: fits}, manager.GangAuto)
	if d.status.Scheduler != trainingv1alpha1.GangNone || d.podGroup != nil {
		t.Fatalf("the user's own PodGroup in the template: scheduler %s, Loom's PodGroup %v; want none", d.status.Scheduler, d.podGroup != nil)
	}

	// Waiting for Volcano (PodGroup, no pods), then edited to scheduler none.
	vj := newJob("ns", "v", 1, 8, trainingv1alpha1.GangVolcano)
	vj.UID = "uid-v"
	d = decide(vj, observed{volcano: true, now: now, fit: fits}, manager.GangAuto)
	if d.podGroup == nil || len(d.create) != 0 {
		t.Fatalf("setup: PodGroup %v, %d pods", d.podGroup != nil, len(d.create))
	}
	vj.Status = d.status
	vj.Spec.Gang.Scheduler = trainingv1alpha1.GangNone
	d = decide(vj, observed{volcano: true, podGroup: d.podGroup, now: now.Add(time.Second), fit: fits}, manager.GangAuto)
	if d.status.Scheduler != trainingv1alpha1.GangNone || !d.removePodGroup || len(d.create) != 2 {
		t.Fatalf("edited to none: scheduler %s, remove PodGroup %v, %d pods", d.status.Scheduler, d.removePodGroup, len(d.create))
	}
}
