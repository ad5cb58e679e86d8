package training

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/agent"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

// Volcano's CRDs are left out so that a test can watch a job wait for them;
// TestVolcano installs them. A fuzzing worker process runs only FuzzDecide,
// which needs no API server.
// testenv starts no API server for go test -fuzz's workers.
func TestMain(m *testing.M) { testenv.MainWithout(m, &env, "scheduling.volcano.sh") }

func startManager(t *testing.T, mutate ...func(*manager.Options)) *testenv.Manager {
	t.Helper()
	reg := &manager.Registry{}
	reg.Add("trainingjob", Setup)
	opts := testenv.ManagerOptions(t)
	opts.LeaderElect = false
	opts.GangScheduler = "none"
	for _, m := range mutate {
		m(&opts)
	}
	return env.StartManager(t, opts, reg)
}

func namespace(t *testing.T, name string) string {
	t.Helper()
	if err := env.CreateNamespace(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return name
}

func gpuTemplate(gpus int64) corev1.PodTemplateSpec {
	c := corev1.Container{Name: "pytorch", Image: "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", Command: []string{"torchrun", "train.py"}}
	if gpus > 0 {
		c.Resources.Limits = corev1.ResourceList{inventory.GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}
	}
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
}

func newJob(ns, name string, workers int32, gpus int64, sched trainingv1alpha1.GangScheduler) *trainingv1alpha1.TrainingJob {
	return &trainingv1alpha1.TrainingJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: trainingv1alpha1.TrainingJobSpec{
			ReplicaSpecs: trainingv1alpha1.ReplicaSpecs{
				Master: trainingv1alpha1.ReplicaSpec{Template: gpuTemplate(gpus)},
				Worker: &trainingv1alpha1.ReplicaSpec{Replicas: &workers, Template: gpuTemplate(gpus)},
			},
			Gang: trainingv1alpha1.GangPolicy{Scheduler: sched},
		},
	}
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %s: %v", obj.GetName(), err)
	}
}

func getJob(t *testing.T, job *trainingv1alpha1.TrainingJob) *trainingv1alpha1.TrainingJob {
	t.Helper()
	got := &trainingv1alpha1.TrainingJob{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(job), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// jobPods lists the job's pods from the API server, sorted by name.
func jobPods(t *testing.T, job *trainingv1alpha1.TrainingJob) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(job.Namespace), client.MatchingLabels{LabelJobName: job.Name}); err != nil {
		t.Fatal(err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

// waitState waits for the job's state and returns the job.
func waitState(t *testing.T, job *trainingv1alpha1.TrainingJob, state trainingv1alpha1.JobState) *trainingv1alpha1.TrainingJob {
	t.Helper()
	var got *trainingv1alpha1.TrainingJob
	testenv.Eventually(t, 30*time.Second, func() error {
		got = getJob(t, job)
		if got.Status.State != state {
			return fmt.Errorf("state %q (conditions %v), want %q", got.Status.State, got.Status.Conditions, state)
		}
		return nil
	})
	return got
}

// waitPods waits until the job has n pods of the given attempt, none
// terminating.
func waitPods(t *testing.T, job *trainingv1alpha1.TrainingJob, n int, attempt int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	testenv.Eventually(t, 30*time.Second, func() error {
		pods = jobPods(t, job)
		if len(pods) != n {
			return fmt.Errorf("%d pods, want %d", len(pods), n)
		}
		for _, p := range pods {
			if p.Labels[LabelAttempt] != fmt.Sprint(attempt) || p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s: attempt %s, deleting %v; want attempt %d", p.Name, p.Labels[LabelAttempt], p.DeletionTimestamp != nil, attempt)
			}
		}
		return nil
	})
	return pods
}

// setPods moves pods to a phase as a kubelet would; exitCode applies to
// terminated phases.
func setPods(t *testing.T, pods []corev1.Pod, phase corev1.PodPhase, exitCode int32) {
	t.Helper()
	for i := range pods {
		p := &pods[i]
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(p), p); err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = phase
		state := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
		if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			reason := "Completed"
			if exitCode != 0 {
				reason = "Error"
			}
			state = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exitCode, Reason: reason}}
		}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", Image: "x", State: state}}
		if err := env.Client.Status().Update(context.Background(), p); err != nil {
			t.Fatalf("setting pod %s to %s: %v", p.Name, phase, err)
		}
	}
}

func cond(job *trainingv1alpha1.TrainingJob, typ string) metav1.Condition {
	for _, c := range job.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

// runAgent runs a simulated node agent for a new node until the test ends.
func runAgent(t *testing.T, node string, o collect.SimOptions) {
	t.Helper()
	if err := env.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	o.Seed = node
	s, err := collect.Simulate(o)
	if err != nil {
		t.Fatal(err)
	}
	setNodeStatus(t, node, s)
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent.Agent{NodeName: node, Lib: s, Client: env.Client, Log: ctrl.Log.WithName("agent"), Interval: time.Hour,
		Simulated: o.System, Metrics: agent.NewMetrics()}
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// setNodeStatus makes a node Ready with its simulated GPUs as its
// allocatable nvidia.com/gpu, as the device plugin and kubelet would: the
// inventory counts what the scheduler sees.
func setNodeStatus(t *testing.T, name string, lib nvml.Interface) {
	t.Helper()
	st, err := collect.Collect(lib, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	gpus := *resource.NewQuantity(int64(st.GPUCount), resource.DecimalSI)
	n.Status.Capacity = corev1.ResourceList{inventory.GPUResource: gpus}
	n.Status.Allocatable = corev1.ResourceList{inventory.GPUResource: gpus}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if err := env.Client.Status().Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	// The API server's admission taints a new Node not-ready; with no node
	// lifecycle controller here, lift it as it would once Ready.
	n.Spec.Taints = nil
	if err := env.Client.Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

// pendingGauges reads the job's loom_trainingjob_pending_gpus and
// loom_trainingjob_pending_free_gpus from the manager's registry; ok is
// false when the job has no series.
func pendingGauges(job *trainingv1alpha1.TrainingJob) (gpus, free float64, ok bool) {
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return 0, 0, false
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] != job.Namespace || labels["name"] != job.Name {
				continue
			}
			switch mf.GetName() {
			case "loom_trainingjob_pending_gpus":
				gpus, ok = m.GetGauge().GetValue(), true
			case "loom_trainingjob_pending_free_gpus":
				free = m.GetGauge().GetValue()
			}
		}
	}
	return gpus, free, ok
}
