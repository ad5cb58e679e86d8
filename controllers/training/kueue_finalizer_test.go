package training

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/testenv"
)

// A Workload Loom creates carries Kueue's resource-in-use finalizer, as
// jobframework's do: deleted by a person while admitted, it stays, its
// quota counted, while the gang's pods terminate, instead of being gone at
// once and its quota given to another job while the pods still hold the
// GPUs; once they are gone Loom drops the finalizer and queues a new one.
func TestKueueDeletedWorkloadKeepsItsQuotaUntilTheGangIsGone(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-in-use")
	startManager(t)
	ctx := context.Background()
	job, u := runAdmitted(t, ns, "deleted")
	if !slices.Contains(u.GetFinalizers(), kueue.ResourceInUseFinalizer) {
		t.Fatalf("Workload finalizers %v, want %s", u.GetFinalizers(), kueue.ResourceInUseFinalizer)
	}
	// A pod that takes its time to terminate, as on a kubelet.
	pod := jobPods(t, job)[0]
	linger := func(v string) {
		patch := []byte(`{"metadata":{"finalizers":` + v + `}}`)
		if err := env.Client.Patch(ctx, &pod, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
	linger(`["example.com/linger"]`)
	t.Cleanup(func() { linger("null") })

	if err := env.Client.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if c := cond(getJob(t, job), trainingv1alpha1.ConditionSuspended); c.Reason != ReasonQueuedInKueue || !strings.Contains(c.Message, "is being deleted") {
			return fmt.Errorf("Suspended %s: %s", c.Reason, c.Message)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil || pod.DeletionTimestamp == nil {
			return fmt.Errorf("pod %s not terminating (%v)", pod.Name, err)
		}
		return nil
	})
	time.Sleep(time.Second)
	w, err := workloadOf(t, job)
	if err != nil || w.GetUID() != u.GetUID() || w.GetDeletionTimestamp() == nil {
		t.Fatalf("while a pod of the gang terminates, the deleted Workload is gone (%v)", err)
	}

	linger("null")
	testenv.Eventually(t, 20*time.Second, func() error {
		w, err := workloadOf(t, job)
		if err != nil {
			return err
		}
		if w.GetUID() == u.GetUID() {
			return fmt.Errorf("the deleted Workload is still there (finalizers %v)", w.GetFinalizers())
		}
		return nil
	})
}
