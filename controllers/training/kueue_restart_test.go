package training

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/optional"
	"github.com/loom-dev/loom/internal/testenv"
)

// A restart (or a leader change) over converged Kueue-queued jobs writes
// nothing: a reconciler with a fresh writer, pod executor and Kueue
// adapter, reading the manager's cache, finds each job's Workload, pods,
// Service and status as they are (a running admitted gang with PodsReady
// True; a job waiting in its queue) and leaves them.
func TestKueueRestartWritesNothing(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-restart")
	m := startManager(t)
	ctx := context.Background()
	workload := func(job *trainingv1alpha1.TrainingJob) (*kueue.Workload, *unstructured.Unstructured, error) {
		return parsedWorkloadOf(t, job)
	}
	var jobs []*trainingv1alpha1.TrainingJob
	for _, name := range []string{"running", "waiting"} {
		job := newJob(ns, name, 1, 0, trainingv1alpha1.GangNone)
		job.Labels = map[string]string{kueue.QueueLabel: "team-a", kueue.MaxExecTimeLabel: "3600"}
		job.Annotations = map[string]string{kueue.ProvReqAnnotationPrefix + "class": "queued"}
		create(t, job)
		testenv.Eventually(t, 20*time.Second, func() error { _, _, err := workload(job); return err })
		jobs = append(jobs, job)
	}
	_, u, err := workload(jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now().UTC().Format(time.RFC3339)
	patch := fmt.Sprintf(`{"status":{"admission":{"clusterQueue":"cq","podSetAssignments":[{"name":"master"},{"name":"worker"}]},"conditions":[`+
		`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
		`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q}]}}`, now, now)
	if err := env.Client.Status().Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	setPods(t, waitPods(t, jobs[0], 2, 1), corev1.PodRunning, 0)
	waitState(t, jobs[0], trainingv1alpha1.StateRunning)
	testenv.Eventually(t, 20*time.Second, func() error {
		w, _, err := workload(jobs[0])
		if err != nil {
			return err
		}
		if c := w.Cond(kueue.CondPodsReady); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("PodsReady %+v", c)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // the running manager's passes are over

	counter := testenv.CountWrites(m.GetClient())
	opts := manager.DefaultOptions()
	opts.GangScheduler = "none"
	r := newReconciler(counter, m.GetAPIReader(), &events.FakeRecorder{}, opts)
	r.volcano = &gang.Volcano{Client: counter, Cache: m.GetCache(), Owner: &trainingv1alpha1.TrainingJob{}, Scheme: m.GetScheme()}
	r.kueue = &kueueJobs{cache: m.GetCache(), live: m.GetAPIReader(), client: counter,
		kind: &optional.Kind{CRD: kueue.WorkloadCRD, GVK: kueue.WorkloadGVK}}
	for _, job := range jobs {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(job)}); err != nil {
			t.Fatal(err)
		}
	}
	if w := counter.Writes(); len(w) != 0 {
		t.Fatalf("a restarted reconciler wrote over converged Kueue jobs: %v", w)
	}
}
