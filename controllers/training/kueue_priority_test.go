package training

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	schedulingv1 "k8s.io/api/scheduling/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// A queued job's Workload carries the priority Kueue's jobframework gives
// the Workloads of its own jobs (ExtractPriority): the priority-class
// label's WorkloadPriorityClass, else the pods' PriorityClass, else the
// cluster's globalDefault one. Kueue orders its queues and picks whom to
// preempt by it: a job whose pods run at a high PriorityClass must not
// enter Kueue at priority 0.
func TestKueueWorkloadPriority(t *testing.T) {
	pc := func(name string, value int32, def bool) client.Object {
		return &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value, GlobalDefault: def}
	}
	wpc := &unstructured.Unstructured{}
	wpc.SetGroupVersionKind(kueue.WorkloadPriorityClassGVK)
	wpc.SetName("urgent")
	wpc.Object["value"] = int64(5000)
	tests := []struct {
		name    string
		objs    []client.Object
		edit    func(*trainingv1alpha1.TrainingJob)
		want    *kueue.PriorityClassRef
		wantVal int32
		missing string
	}{
		{"the label's WorkloadPriorityClass first", []client.Object{wpc, pc("high", 1000, false)}, func(j *trainingv1alpha1.TrainingJob) {
			j.Labels[kueue.PriorityClassLabel] = "urgent"
			j.Spec.ReplicaSpecs.Master.Template.Spec.PriorityClassName = "high"
		}, &kueue.PriorityClassRef{Group: "kueue.x-k8s.io", Kind: "WorkloadPriorityClass", Name: "urgent"}, 5000, ""},
		{"the template's PriorityClass", []client.Object{pc("high", 1000, false), pc("low", 10, true)}, func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.ReplicaSpecs.Worker.Template.Spec.PriorityClassName = "high"
		}, &kueue.PriorityClassRef{Group: "scheduling.k8s.io", Kind: "PriorityClass", Name: "high"}, 1000, ""},
		{"the gang's PriorityClass, which the pods get", []client.Object{pc("high", 1000, false)}, func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.Gang.PriorityClassName = "high"
		}, &kueue.PriorityClassRef{Group: "scheduling.k8s.io", Kind: "PriorityClass", Name: "high"}, 1000, ""},
		{"the cluster's default PriorityClass", []client.Object{pc("high", 1000, false), pc("low", 10, true), pc("lower", 5, true)}, nil,
			&kueue.PriorityClassRef{Group: "scheduling.k8s.io", Kind: "PriorityClass", Name: "lower"}, 5, ""},
		{"none", []client.Object{pc("high", 1000, false)}, nil, nil, 0, ""},
		{"a WorkloadPriorityClass that does not exist holds the Workload", []client.Object{pc("low", 10, true)}, func(j *trainingv1alpha1.TrainingJob) {
			j.Labels[kueue.PriorityClassLabel] = "urgent"
		}, nil, 0, "WorkloadPriorityClass urgent"},
		{"a pods' PriorityClass that does not exist holds it too", []client.Object{pc("low", 10, true)}, func(j *trainingv1alpha1.TrainingJob) {
			j.Spec.Gang.PriorityClassName = "high"
		}, nil, 0, "PriorityClass high"},
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := newJob("ns", "job", 1, 0, trainingv1alpha1.GangNone)
			job.Labels = map[string]string{kueue.QueueLabel: "team"}
			if tt.edit != nil {
				tt.edit(job)
			}
			k := &kueueJobs{cache: fake.NewClientBuilder().WithScheme(scheme).WithObjects(tt.objs...).Build()}
			p, missing, err := k.priority(context.Background(), job)
			if err != nil {
				t.Fatal(err)
			}
			if missing != tt.missing {
				t.Fatalf("missing %q, want %q", missing, tt.missing)
			}
			wl := &kueue.Workload{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(desiredWorkload(job, p, nil).Object, wl); err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.want == nil && (wl.Spec.PriorityClassRef != nil || wl.Spec.Priority != nil):
				t.Fatalf("priority %+v %v, want none", wl.Spec.PriorityClassRef, wl.Spec.Priority)
			case tt.want != nil && (wl.Spec.PriorityClassRef == nil || *wl.Spec.PriorityClassRef != *tt.want || wl.Spec.Priority == nil || *wl.Spec.Priority != tt.wantVal):
				t.Fatalf("priority %+v %v, want %+v %d", wl.Spec.PriorityClassRef, wl.Spec.Priority, tt.want, tt.wantVal)
			}
		})
	}
}

// A job whose priority class does not exist yet is held without a
// Workload, and its Suspended condition names the class.
func TestMissingPriorityClassHoldsTheJob(t *testing.T) {
	now := time.Now()
	job := newJob("ns", "job", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team", kueue.PriorityClassLabel: "urgent"}
	obs := observed{now: now, kueue: kueueObs{queued: true, served: true, missingClass: "WorkloadPriorityClass urgent"},
		fit: inventory.FitResult{Verdict: inventory.FitsNow}}
	d := decide(job, obs, trainingv1alpha1.GangNone)
	c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionSuspended)
	if len(d.create) != 0 || c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "WorkloadPriorityClass urgent, which does not exist") {
		t.Fatalf("created %d pods; Suspended %+v", len(d.create), c)
	}
	if d.requeue != 0 {
		t.Fatalf("rechecks for the class in %v: its creation wakes the job", d.requeue)
	}
}

// A pod template's priorityClassName no object can have (the CRD does not
// check it) is a PriorityClass that does not exist, which holds the
// Workload saying so, read from the real API server: not an error on
// every pass because the client refuses to build the name's path.
func TestKueuePriorityOfANameNoObjectCanHave(t *testing.T) {
	k := &kueueJobs{cache: env.Client}
	for _, name := range []string{"a/b", "..", "50%"} {
		job := newJob("ns", "job", 1, 0, trainingv1alpha1.GangNone)
		job.Labels = map[string]string{kueue.QueueLabel: "team"}
		job.Spec.ReplicaSpecs.Master.Template.Spec.PriorityClassName = name
		p, missing, err := k.priority(context.Background(), job)
		if err != nil || p != nil || missing != "PriorityClass "+name {
			t.Errorf("priorityClassName %q: %+v, missing %q, error %v", name, p, missing, err)
		}
	}
}

// A job held on a priority class that does not exist (a
// WorkloadPriorityClass, a pods' PriorityClass) is woken when the class is
// created, through the shared cache's watch of the classes: its Workload is
// made at once, with the class's priority, not at a poll's next look, and
// no pass reads a class around the cache meanwhile, however many wake it.
func TestAJobHeldOnAMissingPriorityClassProceedsWhenItIsCreated(t *testing.T) {
	installWorkloadCRD(t)
	installKueueCRD(t, "workloadpriorityclasses", "WorkloadPriorityClass", apiextensionsv1.ClusterScoped)
	ns := namespace(t, "kueue-class-watch")
	var live *testenv.ReadCounter
	reg := &manager.Registry{}
	reg.Add("trainingjob", func(ctx context.Context, mgr ctrl.Manager, opts manager.Options) error {
		live = testenv.CountReads(mgr.GetAPIReader())
		return Setup(ctx, liveReadsOf{Manager: mgr, live: live}, opts)
	})
	opts := testenv.ManagerOptions(t)
	opts.LeaderElect, opts.GangScheduler = false, "none"
	env.StartManager(t, opts, reg)
	ctx := context.Background()

	byLabel := newJob(ns, "by-label", 1, 0, trainingv1alpha1.GangNone)
	byLabel.Labels = map[string]string{kueue.QueueLabel: "team", kueue.PriorityClassLabel: "class-watch-urgent"}
	byPods := newJob(ns, "by-pods", 1, 0, trainingv1alpha1.GangNone)
	byPods.Labels = map[string]string{kueue.QueueLabel: "team"}
	byPods.Spec.Gang.PriorityClassName = "class-watch-high"
	for _, job := range []*trainingv1alpha1.TrainingJob{byLabel, byPods} {
		create(t, job)
		testenv.Eventually(t, 20*time.Second, func() error {
			if c := cond(getJob(t, job), trainingv1alpha1.ConditionSuspended); !strings.Contains(c.Message, "which does not exist") {
				return fmt.Errorf("Suspended %q, want it held on its class", c.Message)
			}
			return nil
		})
	}
	time.Sleep(time.Second) // the passes of the creates are over

	wpc := &unstructured.Unstructured{}
	wpc.SetGroupVersionKind(kueue.WorkloadPriorityClassGVK)
	wpc.SetName("class-watch-urgent")
	wpc.Object["value"] = int64(5000)
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "class-watch-high"}, Value: 1000}
	for _, c := range []client.Object{wpc, pc} {
		create(t, c)
		t.Cleanup(func() { _ = env.Client.Delete(ctx, c) })
	}
	for job, want := range map[*trainingv1alpha1.TrainingJob]int64{byLabel: 5000, byPods: 1000} {
		testenv.Eventually(t, 4*time.Second, func() error {
			wl, err := workloadOf(t, job)
			if err != nil {
				return err
			}
			if v, _, _ := unstructured.NestedInt64(wl.Object, "spec", "priority"); v != want {
				return fmt.Errorf("Workload priority %d, want %d", v, want)
			}
			return nil
		})
	}
	for _, r := range live.Reads() {
		if strings.Contains(r, "PriorityClass") {
			t.Errorf("a class read around the cache: %s", r)
		}
	}
}

// liveReadsOf is a manager whose reads around the cache go through live.
type liveReadsOf struct {
	ctrl.Manager
	live client.Reader
}

func (m liveReadsOf) GetAPIReader() client.Reader { return m.live }
