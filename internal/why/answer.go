// Package why is the pure logic of the kubectl loom plugin: the one-line
// answer to "why is this object not working" from an object's conditions,
// labels and events, what to do about the reasons Loom's reconcilers set, and
// the rows of the fleet and driver upgrade tables. Nothing here talks to an
// API server.
package why

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Answer is what `kubectl loom why` says about one object.
type Answer struct {
	// Object is kind/name, e.g. trainingjob/bert.
	Object string `json:"object"`
	// Namespace is empty for cluster-scoped objects.
	Namespace string `json:"namespace,omitempty"`
	// State is the one-word summary (Pending, Failed, notReady, …).
	State string `json:"state,omitempty"`
	// Reason is the condition reason the answer comes from, if any.
	Reason string `json:"reason,omitempty"`
	// Message is the explanation (a condition's message, a label's value).
	Message string `json:"message"`
	// Advice is what to do when the reason is a known one.
	Advice string `json:"advice,omitempty"`
	// Also lists further findings, one line each.
	Also []string `json:"also,omitempty"`
	// Events are the object's last Warning events, oldest first.
	Events []string `json:"events,omitempty"`
}

// Line is the answer in one line: object, state, reason and message.
func (a Answer) Line() string {
	var b strings.Builder
	b.WriteString(a.Object)
	b.WriteString(": ")
	if a.State != "" {
		b.WriteString(a.State)
		if a.Reason != "" {
			b.WriteString(" (" + a.Reason + ")")
		}
		b.WriteString(": ")
	} else if a.Reason != "" {
		b.WriteString(a.Reason + ": ")
	}
	b.WriteString(OneLine(a.Message))
	return b.String()
}

// OneLine folds s onto one line.
func OneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// cond is the condition of type t, or nil.
func cond(cs []metav1.Condition, t string) *metav1.Condition {
	return meta.FindStatusCondition(cs, t)
}

func isTrue(cs []metav1.Condition, t string) bool { return meta.IsStatusConditionTrue(cs, t) }

func isFalse(cs []metav1.Condition, t string) bool { return meta.IsStatusConditionFalse(cs, t) }

// stale notes a status written for an older generation than the spec's.
func stale(observed, generation int64) string {
	if observed != 0 && observed < generation {
		return fmt.Sprintf("the status is for generation %d, the spec is at %d: the reconciler has not caught up yet (is the Loom manager running?)", observed, generation)
	}
	return ""
}

// noStatus is the answer for an object no reconciler has written a status on.
func noStatus(a Answer, controller string) Answer {
	a.State, a.Reason = "Unknown", "NoStatus"
	a.Message = "no conditions yet: the " + controller + " reconciler has not written a status"
	a.Advice = "check that the Loom manager runs and that its --controllers include " + controller +
		" (kubectl logs -n <loom namespace> deploy/loom-manager)"
	return a
}

func appendIf(list []string, s string) []string {
	if s != "" {
		return append(list, s)
	}
	return list
}
