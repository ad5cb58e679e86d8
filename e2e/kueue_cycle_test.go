package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
)

// deactivation runs the running queued job through the real Kueue's
// deactivation cycle, both ways it starts: a person sets its Workload's
// spec.active to false (Kueue evicts it; the gang stops, the job says
// WorkloadDeactivated, the quota is released) and back to true (queued,
// admitted, a new attempt runs); then the job's user suspends it (Loom
// deactivates its Workload, so that it holds no quota while suspended) and
// resumes it (Loom reactivates it, Kueue admits it again).
func deactivation(t *testing.T, job *trainingv1alpha1.TrainingJob) {
	ctx := context.Background()
	setActive := func(active bool) {
		wl, err := jobWorkload(t, job)
		if err != nil {
			t.Fatal(err)
		}
		patch := fmt.Sprintf(`{"spec":{"active":%t}}`, active)
		if err := cluster.Client.Patch(ctx, wl, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	stopped := func(reason string) {
		t.Helper()
		eventually(t, 60*time.Second, func() (bool, string) {
			got := getTJ(t, job.Name)
			s := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionSuspended)
			pods := len(livePodsOf(t, job))
			wl, err := jobWorkload(t, job)
			if err != nil {
				return false, err.Error()
			}
			held := quotaReserved(wl)
			ok := s != nil && s.Status == metav1.ConditionTrue && s.Reason == reason && pods == 0 && !held
			return ok, fmt.Sprintf("%s: Suspended %+v, %d pods, Workload holds quota %t; want reason %s, no pods, no quota", job.Name, s, pods, held, reason)
		})
	}
	running := func(attempt int32) {
		t.Helper()
		got := waitJob(t, job, trainingv1alpha1.StateRunning, 90*time.Second)
		if got.Status.Attempt <= attempt {
			t.Errorf("%s runs attempt %d again; want a new attempt after %d", job.Name, got.Status.Attempt, attempt)
		}
		eventually(t, 30*time.Second, func() (bool, string) {
			n := len(livePodsOf(t, job))
			return n == 2, fmt.Sprintf("%s has %d pods", job.Name, n)
		})
		checkPlacement(t, job)
	}

	attempt := getTJ(t, job.Name).Status.Attempt
	setActive(false)
	stopped("WorkloadDeactivated")
	t.Logf("%s stopped on its deactivated Workload: %s", job.Name,
		meta.FindStatusCondition(getTJ(t, job.Name).Status.Conditions, trainingv1alpha1.ConditionSuspended).Message)
	setActive(true)
	running(attempt)

	attempt = getTJ(t, job.Name).Status.Attempt
	suspend := func(on bool) {
		patch := fmt.Sprintf(`{"spec":{"runPolicy":{"suspend":%t}}}`, on)
		if err := cluster.Client.Patch(ctx, getTJ(t, job.Name), client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	suspend(true)
	stopped("Suspended")
	if wl, err := jobWorkload(t, job); err != nil {
		t.Fatal(err)
	} else if active, found, _ := unstructured.NestedBool(wl.Object, "spec", "active"); !found || active {
		t.Errorf("a suspended job's Workload: spec.active %t (set %t); want false, so that it holds no quota", active, found)
	}
	suspend(false)
	running(attempt)
	t.Logf("%s: deactivated and reactivated by hand, suspended and resumed, against Kueue", job.Name)
	if err := cluster.Client.Delete(ctx, job); err != nil {
		t.Fatal(err)
	}
}

// quotaReserved: the Workload's QuotaReserved condition is True.
func quotaReserved(wl *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == kueue.CondQuotaReserved {
			return m["status"] == string(metav1.ConditionTrue)
		}
	}
	return false
}
