package training

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
)

// The manager's auto default picks Volcano only where it is installed; a
// job's own choice, or an explicit manager default, always wins.
func TestSchedulerAuto(t *testing.T) {
	for _, c := range []struct {
		spec, def trainingv1alpha1.GangScheduler
		volcano   bool
		want      trainingv1alpha1.GangScheduler
		auto      bool
	}{
		{"", manager.GangAuto, true, trainingv1alpha1.GangVolcano, true},
		{"", manager.GangAuto, false, trainingv1alpha1.GangNone, true},
		{"", trainingv1alpha1.GangVolcano, false, trainingv1alpha1.GangVolcano, false},
		{"", trainingv1alpha1.GangNone, true, trainingv1alpha1.GangNone, false},
		{trainingv1alpha1.GangVolcano, manager.GangAuto, false, trainingv1alpha1.GangVolcano, false},
		{trainingv1alpha1.GangNone, manager.GangAuto, true, trainingv1alpha1.GangNone, false},
	} {
		job := newJob("ns", "j", 1, 0, c.spec)
		got, auto := scheduler(job, c.def, c.volcano)
		if got != c.want || auto != c.auto {
			t.Errorf("spec %q, default %q, volcano %v: got %q (auto %v), want %q (auto %v)", c.spec, c.def, c.volcano, got, auto, c.want, c.auto)
		}
	}
}

// Under auto without Volcano, the job runs ungated and its Created
// condition says why.
func TestAutoWithoutVolcanoSaysSo(t *testing.T) {
	job := newJob("ns", "j", 1, 8, "")
	d := decide(job, observed{volcano: false, now: time.Now()}, manager.GangAuto)
	if d.status.Scheduler != trainingv1alpha1.GangNone {
		t.Fatalf("scheduler %q, want none", d.status.Scheduler)
	}
	c := meta.FindStatusCondition(d.status.Conditions, trainingv1alpha1.ConditionCreated)
	if c == nil || !strings.Contains(c.Message, "gang scheduling off: Volcano is not installed") {
		t.Fatalf("Created condition does not say gang scheduling is off: %+v", c)
	}
}
