package training

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/testenv"
)

// An admission that covers part of the gang (a pod set assigned fewer
// pods than it has, or left out) does not start it: a gang runs whole,
// and fewer pods than the quota counted would be a gang that never
// finishes its rendezvous, more would run past the quota. The job says so,
// the admission is released for Kueue to admit the Workload again, and a
// whole admission starts the gang.
func TestKueuePartialAdmissionDoesNotStartTheGang(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-partial")
	startManager(t)
	job := newJob(ns, "partial", 3, 0, trainingv1alpha1.GangNone)
	job.Labels = map[string]string{kueue.QueueLabel: "team-a"}
	create(t, job)
	var u *unstructured.Unstructured
	testenv.Eventually(t, 20*time.Second, func() (err error) { u, err = workloadOf(t, job); return err })
	now := metav1.Now().UTC().Format(time.RFC3339)
	statusPatch(t, u, fmt.Sprintf(`{"status":{"admission":{"clusterQueue":"cq","podSetAssignments":[{"name":"master","count":1},{"name":"worker","count":1}]},"conditions":[`+
		`{"type":"QuotaReserved","status":"True","reason":"QuotaReserved","message":"reserved","lastTransitionTime":%q},`+
		`{"type":"Admitted","status":"True","reason":"Admitted","message":"admitted","lastTransitionTime":%q}]}}`, now, now))
	testenv.Eventually(t, 20*time.Second, func() error {
		w, _, err := parsedWorkloadOf(t, job)
		if err != nil {
			return err
		}
		if w.QuotaReserved() {
			return fmt.Errorf("the partial admission is not released")
		}
		got := getJob(t, job)
		if c := cond(got, trainingv1alpha1.ConditionSuspended); got.Status.State != trainingv1alpha1.StateSuspended ||
			!strings.Contains(c.Message, "covered part of the gang (pod set worker: 1 of 3 pods), and a gang runs whole") {
			return fmt.Errorf("state %s, Suspended %+v", got.Status.State, c)
		}
		return nil
	})
	if pods := jobPods(t, job); len(pods) != 0 {
		t.Fatalf("a partial admission started pods %v", names(pods))
	}
	_, u, err := parsedWorkloadOf(t, job)
	if err != nil {
		t.Fatal(err)
	}
	admitWorkload(t, u)
	waitPods(t, job, 4, 1)
}
