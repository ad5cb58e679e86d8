package driverupgrade

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

type events struct{ got []string }

func (e *events) Eventf(_ runtime.Object, _ runtime.Object, kind, reason, action, note string, args ...any) {
	e.got = append(e.got, kind+" "+reason+" "+action+": "+fmt.Sprintf(note, args...))
}

func (e *events) AnnotatedEventf(o, _ runtime.Object, _ map[string]string, kind, reason, action, note string, args ...any) {
	e.Eventf(o, nil, kind, reason, action, note, args...)
}

// Every step is a Node event with GPU Operator's reason; a failure is a
// Warning; a release says so.
func TestEvents(t *testing.T) {
	rec := &events{}
	r := &Reconciler{Recorder: rec}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	r.event(n, "", gpuv1alpha1.UpgradeRequired, "")
	r.event(n, gpuv1alpha1.DrainRequired, gpuv1alpha1.UpgradeFailed, "")
	r.event(n, gpuv1alpha1.UpgradeDone, "", releasedPolicy)
	r.event(n, gpuv1alpha1.DrainRequired, "", releasedUnplaced)
	want := []string{
		"Normal GPUDriverUpgrade Upgrade: Successfully updated node state label to upgrade-required",
		"Warning GPUDriverUpgrade Upgrade: Driver upgrade failed in drain-required",
		"Normal GPUDriverUpgrade Release: Loom released the node from its driver upgrade (its policy is gone",
		"Normal GPUDriverUpgrade Release: Loom released the node from its driver upgrade (no driver DaemonSet of its policy selects the node",
	}
	if len(rec.got) != len(want) {
		t.Fatalf("events %q", rec.got)
	}
	for i, w := range want {
		if !strings.HasPrefix(rec.got[i], w) {
			t.Errorf("event %d = %q, want prefix %q", i, rec.got[i], w)
		}
	}
}

// The gauges say done, pending, in progress and failed per policy.
func TestRecordGauges(t *testing.T) {
	recordGauges("p", summary{upToDate: 7, waiting: 2, inProgress: 1, failed: []string{"x"}})
	for state, want := range map[string]float64{"done": 7, "pending": 2, "in_progress": 1, "failed": 1} {
		if got := testutil.ToFloat64(upgradeNodes.WithLabelValues("p", state)); got != want {
			t.Errorf("%s = %v, want %v", state, got, want)
		}
	}
}
