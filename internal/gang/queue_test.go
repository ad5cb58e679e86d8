package gang

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
)

func TestCheckQueue(t *testing.T) {
	queue := func(state schedulingv1beta1.QueueState) *schedulingv1beta1.Queue {
		return &schedulingv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "research"}, Status: schedulingv1beta1.QueueStatus{State: state}}
	}
	tests := []struct {
		name, queue string
		q           *schedulingv1beta1.Queue
		reason, msg string
	}{
		{"missing", "research", nil, ReasonQueueNotFound, `Volcano queue "research" does not exist`},
		{"missing default", "", nil, ReasonQueueNotFound, `Volcano queue "default" does not exist`},
		{"closed", "research", queue(schedulingv1beta1.QueueStateClosed), ReasonQueueClosed, `Volcano queue "research" is Closed`},
		{"closing", "research", queue(schedulingv1beta1.QueueStateClosing), ReasonQueueClosed, `is Closing: it admits no new gangs`},
		{"open", "research", queue(schedulingv1beta1.QueueStateOpen), "", ""},
		{"no state yet", "research", queue(""), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CheckQueue(tt.queue, tt.q)
			if got.Reason != tt.reason || !strings.Contains(got.Message, tt.msg) || (tt.msg == "") != (got.Message == "") {
				t.Fatalf("CheckQueue = %+v, want %s containing %q", got, tt.reason, tt.msg)
			}
		})
	}
}

func TestUnschedulable(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	unsched := func(at metav1.Time, reason string) schedulingv1beta1.PodGroupCondition {
		return schedulingv1beta1.PodGroupCondition{Type: schedulingv1beta1.PodGroupUnschedulableType, Status: corev1.ConditionTrue,
			Reason: reason, Message: "4/4 tasks in gang unschedulable: Insufficient nvidia.com/gpu", LastTransitionTime: at}
	}
	scheduled := func(at metav1.Time) schedulingv1beta1.PodGroupCondition {
		return schedulingv1beta1.PodGroupCondition{Type: schedulingv1beta1.PodGroupScheduled, Status: corev1.ConditionTrue, LastTransitionTime: at}
	}
	tests := []struct {
		name        string
		conds       []schedulingv1beta1.PodGroupCondition
		reason, why string
	}{
		{"none", nil, "", ""},
		{"unschedulable", []schedulingv1beta1.PodGroupCondition{unsched(t0, "NotEnoughResources")},
			"NotEnoughResources", "NotEnoughResources: 4/4 tasks in gang unschedulable: Insufficient nvidia.com/gpu"},
		{"scheduled since: no longer applies", []schedulingv1beta1.PodGroupCondition{unsched(t0, "NotEnoughResources"), scheduled(t1)}, "", ""},
		{"unschedulable again after being scheduled", []schedulingv1beta1.PodGroupCondition{scheduled(t0), unsched(t1, "NotEnoughResources")},
			"NotEnoughResources", "NotEnoughResources: 4/4"},
		{"a reason a condition cannot carry", []schedulingv1beta1.PodGroupCondition{unsched(t0, "not enough")}, "Unschedulable", "not enough: 4/4"},
		{"False is nothing", []schedulingv1beta1.PodGroupCondition{{Type: schedulingv1beta1.PodGroupUnschedulableType, Status: corev1.ConditionFalse}}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reason, why := Unschedulable(&schedulingv1beta1.PodGroup{Status: schedulingv1beta1.PodGroupStatus{Conditions: tt.conds}})
			if reason != tt.reason || !strings.HasPrefix(why, tt.why) || (tt.why == "") != (why == "") {
				t.Fatalf("Unschedulable = %q, %q; want %q, %q", reason, why, tt.reason, tt.why)
			}
		})
	}
	if r, w := Unschedulable(nil); r != "" || w != "" {
		t.Fatalf("Unschedulable(nil) = %q, %q", r, w)
	}
}
