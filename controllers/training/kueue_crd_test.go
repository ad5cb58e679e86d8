package training

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// A queued job created before Kueue is installed waits, saying so, and gets
// its Workload as soon as the Workload CRD is served: the CRD's watch wakes
// it, well before any timer would. Its own API server, which has never
// served the CRD (the package's installs it in other tests).
func TestKueueWorkloadCRDInstalledLaterWakesTheJob(t *testing.T) {
	ctx := context.Background()
	own, err := testenv.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = own.Stop() })
	reg := &manager.Registry{}
	reg.Add("trainingjob", Setup)
	opts := testenv.ManagerOptions(t)
	opts.LeaderElect = false
	opts.GangScheduler = "none"
	own.StartManager(t, opts, reg)
	const ns = "kueue-later"
	if err := own.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	job := newJob(ns, "early", 1, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	if err := own.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		j := &trainingv1alpha1.TrainingJob{}
		if err := own.Client.Get(ctx, client.ObjectKeyFromObject(job), j); err != nil {
			return err
		}
		if c := cond(j, trainingv1alpha1.ConditionScheduled); !strings.Contains(c.Message, "Workload CRD is not installed") {
			return fmt.Errorf("Scheduled = %+v, want it waiting for Kueue's Workload CRD", c)
		}
		return nil
	})
	installWorkloadCRDIn(t, own)
	testenv.Eventually(t, 3*time.Second, func() error {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(kueue.WorkloadGVK.GroupVersion().WithKind("WorkloadList"))
		if err := own.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Workloads, want the job's", len(list.Items))
		}
		return nil
	})
}
