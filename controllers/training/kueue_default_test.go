package training

import (
	"fmt"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/testenv"
)

// installLocalQueueCRD installs a stand-in for Kueue's LocalQueue CRD.
func installLocalQueueCRD(t *testing.T) {
	t.Helper()
	installKueueCRD(t, "localqueues", "LocalQueue", apiextensionsv1.NamespaceScoped)
}

// localQueue creates a LocalQueue.
func localQueue(t *testing.T, ns, name string) {
	t.Helper()
	lq := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"clusterQueue": "cluster"}}}
	lq.SetGroupVersionKind(kueue.LocalQueueGVK)
	lq.SetNamespace(ns)
	lq.SetName(name)
	create(t, lq)
}

// A job created without a queue label in a namespace that has a LocalQueue
// named default is labelled with it and queued through it, as Kueue's
// webhook labels its own jobs (LocalQueueDefaulting, locked on in Kueue
// v0.17): a platform whose jobs all go through Kueue is not bypassed by
// one that forgot the label. A job naming its LocalQueue keeps it, and one
// in a namespace without a default LocalQueue runs outside Kueue.
func TestKueueDefaultLocalQueue(t *testing.T) {
	installWorkloadCRD(t)
	installLocalQueueCRD(t)
	withDefault := namespace(t, "kueue-default-lq")
	without := namespace(t, "kueue-no-default-lq")
	localQueue(t, withDefault, kueue.DefaultLocalQueue)
	localQueue(t, withDefault, "team")
	localQueue(t, without, "team")
	startManager(t)

	unlabelled := newJob(withDefault, "unlabelled", 1, 0, trainingv1alpha1.GangNone)
	named := newJob(withDefault, "named", 1, 0, trainingv1alpha1.GangNone)
	named.Labels = map[string]string{kueue.QueueLabel: "team"}
	elsewhere := newJob(without, "elsewhere", 1, 0, trainingv1alpha1.GangNone)
	for _, job := range []*trainingv1alpha1.TrainingJob{unlabelled, named, elsewhere} {
		create(t, job)
	}
	for job, queue := range map[*trainingv1alpha1.TrainingJob]string{unlabelled: kueue.DefaultLocalQueue, named: "team"} {
		testenv.Eventually(t, 20*time.Second, func() error {
			if q := getJob(t, job).Labels[kueue.QueueLabel]; q != queue {
				return fmt.Errorf("%s: queue label %q, want %q", job.Name, q, queue)
			}
			wl, err := workloadOf(t, job)
			if err != nil {
				return err
			}
			if q, _, _ := unstructured.NestedString(wl.Object, "spec", "queueName"); q != queue {
				return fmt.Errorf("%s: Workload in LocalQueue %q, want %q", job.Name, q, queue)
			}
			return nil
		})
		waitState(t, job, trainingv1alpha1.StateSuspended)
		if n := len(jobPods(t, job)); n != 0 {
			t.Fatalf("%s, waiting for Kueue, has %d pods", job.Name, n)
		}
	}
	waitPods(t, elsewhere, 2, 0)
	if q, ok := getJob(t, elsewhere).Labels[kueue.QueueLabel]; ok {
		t.Fatalf("a job in a namespace without a default LocalQueue was labelled %q", q)
	}
}
