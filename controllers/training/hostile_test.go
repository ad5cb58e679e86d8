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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// Careless or hostile specs the object alone decides are rejected at apply,
// the message naming the field: durations past ten years, fractional GPUs,
// a nodeName that bypasses the gang, more containers than the CEL budget
// allows for.
func TestHostileSpecsAreRejectedNamingTheField(t *testing.T) {
	ns := namespace(t, "hostile")
	gpu := func(q string) corev1.ResourceList {
		return corev1.ResourceList{inventory.GPUResource: resource.MustParse(q)}
	}
	tests := []struct {
		name   string
		mutate func(*trainingv1alpha1.TrainingJob)
		want   []string
	}{
		{"a deadline past ten years", func(j *trainingv1alpha1.TrainingJob) { j.Spec.RunPolicy.ActiveDeadlineSeconds = ptr(int64(1e12)) },
			[]string{"spec.runPolicy.activeDeadlineSeconds", "less than or equal to 315360000"}},
		{"a deadline past a duration", func(j *trainingv1alpha1.TrainingJob) { j.Spec.RunPolicy.ActiveDeadlineSeconds = ptr(int64(1 << 62)) },
			[]string{"spec.runPolicy.activeDeadlineSeconds", "less than or equal to 315360000"}},
		{"a TTL past ten years", func(j *trainingv1alpha1.TrainingJob) { j.Spec.RunPolicy.TTLSecondsAfterFinished = ptr(int32(1 << 30)) },
			[]string{"spec.runPolicy.ttlSecondsAfterFinished", "less than or equal to 315360000"}},
		{"half a GPU", func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.ReplicaSpecs.Worker.Template.Spec.Containers[0].Resources.Limits = gpu("500m")
		},
			[]string{"spec.replicaSpecs.worker", "template.spec.containers[*].resources: nvidia.com/gpu and every other nvidia.com/* request and limit must be whole numbers"}},
		{"a fractional MIG request", func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.ReplicaSpecs.Master.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("1.5")}
		}, []string{"spec.replicaSpecs.master", "template.spec.containers[*].resources"}},
		{"a fractional GPU in an init container", func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.ReplicaSpecs.Worker.Template.Spec.InitContainers = []corev1.Container{{Name: "warm", Image: "x", Resources: corev1.ResourceRequirements{Requests: gpu("0.25")}}}
		}, []string{"spec.replicaSpecs.worker", "template.spec.initContainers[*].resources"}},
		{"a fractional GPU in the pod's resources", func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.ReplicaSpecs.Worker.Template.Spec.Resources = &corev1.ResourceRequirements{Limits: gpu("0.5")}
		}, []string{"spec.replicaSpecs.worker", "template.spec.resources: nvidia.com/gpu"}},
		{"nodeName", func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.ReplicaSpecs.Worker.Template.Spec.NodeName = "gpu-node-0"
		},
			[]string{"spec.replicaSpecs.worker", "template.spec.nodeName must not be set"}},
		{"a priority class no PriorityClass can be named", func(j *trainingv1alpha1.TrainingJob) { j.Spec.Gang.PriorityClassName = "High Priority" },
			[]string{"spec.gang.priorityClassName"}},
		{"a priority class past a name's length", func(j *trainingv1alpha1.TrainingJob) { j.Spec.Gang.PriorityClassName = strings.Repeat("p", 254) },
			[]string{"spec.gang.priorityClassName", "253"}},
		{"a queue no Volcano Queue can be named", func(j *trainingv1alpha1.TrainingJob) { j.Spec.Gang.Queue = "Team_A" },
			[]string{"spec.gang.queue"}},
		{"65 containers", func(j *trainingv1alpha1.TrainingJob) {
			cs := &j.Spec.ReplicaSpecs.Worker.Template.Spec.Containers
			for i := range 64 {
				*cs = append(*cs, corev1.Container{Name: fmt.Sprint("c", i), Image: "x"})
			}
		}, []string{"spec.replicaSpecs.worker.template.spec.containers", "must have at most 64 items"}},
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
			for _, w := range tt.want {
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), w) {
					t.Fatalf("error %v, want it to say %q", err, w)
				}
			}
		})
	}
	// Whole GPUs in any spelling, fractional CPUs, the longest durations.
	ok := newJob(ns, "whole", 1, 8, trainingv1alpha1.GangNone)
	ok.Spec.RunPolicy.ActiveDeadlineSeconds = ptr(int64(trainingv1alpha1.MaxSeconds))
	ok.Spec.RunPolicy.TTLSecondsAfterFinished = ptr(int32(trainingv1alpha1.MaxSeconds))
	ok.Spec.Gang.PriorityClassName, ok.Spec.Gang.Queue = "team-a.high", "team-a"
	ok.Spec.ReplicaSpecs.Master.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{inventory.GPUResource: resource.MustParse("8000m"), corev1.ResourceCPU: resource.MustParse("500m")}
	ok.Spec.ReplicaSpecs.Worker.Template.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("2")}
	create(t, ok)
}

// A job asking for more pods than --max-workload-pods is held without
// pods, saying how many it asked for and the limit.
func TestAJobOverThePodLimitIsHeld(t *testing.T) {
	ns := namespace(t, "toomany")
	startManager(t, func(o *manager.Options) { o.MaxWorkloadPods = 3 })
	job := newJob(ns, "wide", 5, 0, trainingv1alpha1.GangNone)
	create(t, job)
	got := waitState(t, job, trainingv1alpha1.StateHeld)
	for _, typ := range []string{trainingv1alpha1.ConditionReady, trainingv1alpha1.ConditionScheduled, trainingv1alpha1.ConditionCreated} {
		if c := cond(got, typ); c.Status != metav1.ConditionFalse || c.Reason != ReasonTooManyPods ||
			!strings.Contains(c.Message, "asks for 6 pods") || !strings.Contains(c.Message, "--max-workload-pods=3") {
			t.Fatalf("%s = %+v", typ, c)
		}
	}
	time.Sleep(time.Second)
	if pods := jobPods(t, job); len(pods) != 0 {
		t.Fatalf("a held job created pods %v", names(pods))
	}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(job), &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a held job's Service: %v", err)
	}
}

// A job whose pod template carries a label or annotation no pod may have
// (the CRD's schema cannot check a map's keys) is held without pods or a
// Service, Stalled, naming the fields, instead of every pod's create
// failing.
func TestAJobWhosePodsCannotCarryItsTemplateMetadataIsHeld(t *testing.T) {
	ns := namespace(t, "badmeta")
	startManager(t)
	job := newJob(ns, "badmeta", 2, 0, trainingv1alpha1.GangNone)
	job.Spec.ReplicaSpecs.Worker.Template.Labels = map[string]string{"team": strings.Repeat("a", 64)}
	job.Spec.ReplicaSpecs.Master.Template.Annotations = map[string]string{"not a key": "x"}
	create(t, job)
	got := waitState(t, job, trainingv1alpha1.StateHeld)
	for _, typ := range []string{trainingv1alpha1.ConditionReady, trainingv1alpha1.ConditionScheduled, trainingv1alpha1.ConditionCreated, trainingv1alpha1.ConditionStalled} {
		c := cond(got, typ)
		if want := typ == trainingv1alpha1.ConditionStalled; (c.Status == metav1.ConditionTrue) != want {
			t.Fatalf("%s = %+v", typ, c)
		}
		if c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, "spec.replicaSpecs.worker.template.metadata.labels: Invalid value") ||
			!strings.Contains(c.Message, "spec.replicaSpecs.master.template.metadata.annotations: Invalid value: \"not a key\"") {
			t.Fatalf("%s = %+v", typ, c)
		}
	}
	time.Sleep(time.Second)
	if pods := jobPods(t, job); len(pods) != 0 {
		t.Fatalf("a held job created pods %v", names(pods))
	}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(job), &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a held job's Service: %v", err)
	}
}

// A pod name the job wants, taken by a pod someone else created, says
// NameConflict naming the pod; the stranger's pod is left exactly as it
// was, and once it is gone the job proceeds. A user's Service of the job's
// name says the same.
func TestANameTakenByAStrangerSaysNameConflict(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "conflict")
	startManager(t)
	stranger := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "clash-worker-0", Namespace: ns, Labels: map[string]string{"app": "mine"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	create(t, stranger)
	job := newJob(ns, "clash", 1, 0, trainingv1alpha1.GangNone)
	create(t, job)
	testenv.Eventually(t, 30*time.Second, func() error {
		got := getJob(t, job)
		for _, typ := range []string{trainingv1alpha1.ConditionReady, trainingv1alpha1.ConditionCreated} {
			if c := cond(got, typ); c.Reason != ReasonNameConflict || !strings.Contains(c.Message, "pod clash-worker-0 exists and is not controlled by clash") {
				return fmt.Errorf("%s = %+v", typ, c)
			}
		}
		return nil
	})
	time.Sleep(time.Second)
	now := &corev1.Pod{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(stranger), now); err != nil {
		t.Fatal(err)
	}
	if now.UID != stranger.UID || now.ResourceVersion != stranger.ResourceVersion || len(now.OwnerReferences) != 0 || now.DeletionTimestamp != nil || now.Labels[LabelJobName] != "" {
		t.Fatalf("the stranger's pod was touched: %+v", now.ObjectMeta)
	}
	if err := env.Client.Delete(ctx, stranger, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	waitPods(t, job, 2, 0)

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svcclash", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	create(t, svc)
	job = newJob(ns, "svcclash", 1, 0, trainingv1alpha1.GangNone)
	create(t, job)
	testenv.Eventually(t, 30*time.Second, func() error {
		if c := cond(getJob(t, job), trainingv1alpha1.ConditionReady); c.Reason != ReasonNameConflict || !strings.Contains(c.Message, "Service "+ns+"/svcclash exists") {
			return fmt.Errorf("Ready = %+v", c)
		}
		return nil
	})
	after := &corev1.Service{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(svc), after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != svc.ResourceVersion || len(after.OwnerReferences) != 0 {
		t.Fatalf("the user's Service was touched: %+v", after.ObjectMeta)
	}
}

// A queued job one of whose names a user's object holds (its Service's,
// a pod's) says so while it waits, and gets no Kueue Workload: admitted, it
// would hold quota for a gang that cannot start. Once the name is free it
// is queued.
func TestAQueuedJobWithAStrangersNameHoldsNoQuota(t *testing.T) {
	installWorkloadCRD(t)
	ctx := context.Background()
	ns := namespace(t, "conflict-queued")
	startManager(t)
	for _, tt := range []struct {
		job      string
		stranger client.Object
		says     string
	}{
		{"svc", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc", Namespace: ns},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, "Service " + ns + "/svc exists"},
		{"pod", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-worker-0", Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, "pod pod-worker-0 exists and is not controlled by pod"},
	} {
		create(t, tt.stranger)
		job := newJob(ns, tt.job, 1, 0, trainingv1alpha1.GangNone)
		job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
		create(t, job)
		testenv.Eventually(t, 20*time.Second, func() error {
			got := getJob(t, job)
			if c := cond(got, trainingv1alpha1.ConditionReady); c.Reason != ReasonNameConflict || !strings.Contains(c.Message, tt.says) {
				return fmt.Errorf("Ready = %+v", c)
			}
			if c := cond(got, trainingv1alpha1.ConditionStalled); c.Status != metav1.ConditionTrue {
				return fmt.Errorf("Stalled = %+v", c)
			}
			return nil
		})
		time.Sleep(time.Second)
		if _, err := workloadOf(t, job); !apierrors.IsNotFound(err) {
			t.Fatalf("%s: a job stopped by a name conflict has a Workload (%v)", tt.job, err)
		}
		if err := env.Client.Delete(ctx, tt.stranger, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, func() error { _, err := workloadOf(t, job); return err })
		waitSuspended(t, job, ReasonQueuedInKueue, "waiting for Kueue")
	}
}

// A stale copy of a job (the cache behind the server) cannot undo what a
// newer pass decided: the restart, end, suspension or resumption computed
// from it fails its guarded status write before any pod is deleted, and the
// TTL delete of a finished job carries its UID, so a job of the same name
// created since survives.
func TestAStaleCopyCannotUndoADecision(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "stale")
	opts := manager.DefaultOptions()
	opts.GangScheduler = "none"
	r := newReconciler(env.Client, env.Client, &events.FakeRecorder{}, opts)

	job := newJob(ns, "guarded", 1, 0, trainingv1alpha1.GangNone)
	create(t, job)
	job = getJob(t, job)
	job.Status = decide(job, observed{now: time.Now()}, trainingv1alpha1.GangNone).status
	if err := env.Client.Status().Update(ctx, job); err != nil {
		t.Fatal(err)
	}
	pods := stalePodsOnServer(t, job)
	stale := getJob(t, job)
	job.Status.Workers = 7 // a newer pass wrote since the stale copy was read
	if err := env.Client.Status().Update(ctx, job); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*trainingv1alpha1.TrainingJob, *observed){
		"restart": func(_ *trainingv1alpha1.TrainingJob, obs *observed) { obs.pods[1].Status.Phase = corev1.PodFailed },
		"fail": func(j *trainingv1alpha1.TrainingJob, _ *observed) {
			j.Spec.RunPolicy.ActiveDeadlineSeconds = ptr(int64(1))
		},
		"suspend": func(j *trainingv1alpha1.TrainingJob, _ *observed) { j.Spec.RunPolicy.Suspend = true },
		"resume": func(j *trainingv1alpha1.TrainingJob, _ *observed) {
			setCond(&j.Status, trainingv1alpha1.ConditionSuspended, metav1.ConditionTrue, ReasonSuspended, "", 1, time.Now())
		},
	} {
		t.Run(name, func(t *testing.T) {
			j, obs := stale.DeepCopy(), observed{pods: podPointers(pods), now: time.Now().Add(time.Minute)}
			mutate(j, &obs)
			d := decide(j, obs, trainingv1alpha1.GangNone)
			if !urgent(j, &d) || len(d.remove) == 0 {
				t.Fatalf("setup: urgent %v removes %d", urgent(j, &d), len(d.remove))
			}
			res, err := r.execute(ctx, j, obs, d)
			if err != nil || res.RequeueAfter != conflictRetry {
				t.Fatalf("execute = %+v, %v; want a conflict, looked at again", res, err)
			}
			if got := getJob(t, job); got.Status.Workers != 7 || got.Status.Attempt != 0 || got.Status.State != job.Status.State {
				t.Fatalf("the stale decision was written: %+v", got.Status)
			}
			if left := jobPods(t, job); len(left) != 2 || left[0].DeletionTimestamp != nil || left[1].DeletionTimestamp != nil {
				t.Fatalf("pods after the stale decision: %v", names(left))
			}
		})
	}

	// The TTL: the cache still shows the finished job; a new one of its
	// name has been created since.
	old := newJob(ns, "ttl", 1, 0, trainingv1alpha1.GangNone)
	old.Spec.RunPolicy.TTLSecondsAfterFinished = ptr(int32(1))
	create(t, old)
	old = getJob(t, old)
	done := metav1.NewTime(time.Now().Add(-time.Minute))
	old.Status.State, old.Status.CompletionTime = trainingv1alpha1.StateSucceeded, &done
	if err := env.Client.Status().Update(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	renewed := newJob(ns, "ttl", 1, 0, trainingv1alpha1.GangNone)
	create(t, renewed)
	obs := observed{now: time.Now()}
	d := decide(old, obs, trainingv1alpha1.GangNone)
	if !d.deleteJob {
		t.Fatal("setup: the finished job's TTL has not passed")
	}
	if _, err := r.execute(ctx, old, obs, d); err != nil {
		t.Fatal(err)
	}
	if got := getJob(t, renewed); got.UID != renewed.UID || got.DeletionTimestamp != nil {
		t.Fatalf("the new job of the name was deleted by the old one's TTL (uid %s, was %s)", got.UID, renewed.UID)
	}
}

// stalePodsOnServer creates the job's pods of attempt 0, running, on the
// API server.
func stalePodsOnServer(t *testing.T, job *trainingv1alpha1.TrainingJob) []corev1.Pod {
	t.Helper()
	for _, role := range roles {
		p := buildPod(job, pytorch{}, role, 0, 0, trainingv1alpha1.GangNone)
		create(t, p)
	}
	setPods(t, jobPods(t, job), corev1.PodRunning, 0)
	return jobPods(t, job)
}

func podPointers(pods []corev1.Pod) []*corev1.Pod {
	out := make([]*corev1.Pod, len(pods))
	for i := range pods {
		out[i] = pods[i].DeepCopy()
	}
	return out
}

// A job deleted and created again under its name (kubectl replace --force,
// Flux's force apply, a CI pipeline) meets what the garbage collector has
// not removed yet of the one before: its Service, its pods still
// terminating. Those go by themselves: the new job waits for them without
// calling them a NameConflict (Stalled, which kstatus reads as Failed and
// Helm's --wait and Flux give up on), then makes its own gang.
func TestARecreatedJobWaitsForTheOldOnesChildren(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "recreate")
	startManager(t)
	job := newJob(ns, "again", 1, 0, trainingv1alpha1.GangNone)
	create(t, job)
	old := waitPods(t, job, 2, 0)
	// The kubelet holds the master while it shuts down.
	master := &old[0]
	master.Finalizers = []string{"test.loom.dev/kubelet"}
	if err := env.Client.Update(ctx, master); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, getJob(t, job), client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	// The garbage collector (none runs here) has deleted the pods and not
	// yet the Service.
	for i := range old {
		if err := env.Client.Delete(ctx, &old[i]); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), &trainingv1alpha1.TrainingJob{}); err == nil {
			return fmt.Errorf("the old job is still there")
		}
		return nil
	})
	again := newJob(ns, "again", 1, 0, trainingv1alpha1.GangNone)
	create(t, again)
	deadline := time.Now().Add(3 * time.Second)
	seen := false
	for time.Now().Before(deadline) {
		got := getJob(t, again)
		if got.Status.State != "" {
			seen = true
		}
		for _, typ := range []string{trainingv1alpha1.ConditionReady, trainingv1alpha1.ConditionCreated} {
			if c := cond(got, typ); c.Reason == ReasonNameConflict {
				t.Fatalf("%s says the old job's children are a NameConflict: %s", typ, c.Message)
			}
		}
		if c := cond(got, trainingv1alpha1.ConditionStalled); c.Status == metav1.ConditionTrue {
			t.Fatalf("the job is Stalled while the old job's children go: %s: %s", c.Reason, c.Message)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !seen {
		t.Fatal("the new job got no status while it waited")
	}
	// The garbage collector and the kubelet finish.
	svc := &corev1.Service{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "again"}, svc); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(svc); ref == nil || ref.UID != job.UID {
		t.Fatalf("the old Service was taken over before it went: %+v", svc.OwnerReferences)
	}
	if err := env.Client.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(master), master); err != nil {
		t.Fatal(err)
	}
	master.Finalizers = nil
	if err := env.Client.Update(ctx, master); err != nil {
		t.Fatal(err)
	}
	fresh := getJob(t, again)
	for _, p := range waitPods(t, again, 2, 0) {
		if !metav1.IsControlledBy(&p, fresh) {
			t.Fatalf("pod %s is not the new job's: %+v", p.Name, p.OwnerReferences)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		svc := &corev1.Service{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "again"}, svc); err != nil {
			return err
		}
		if !metav1.IsControlledBy(svc, fresh) {
			return fmt.Errorf("Service owners %+v", svc.OwnerReferences)
		}
		return nil
	})
}
