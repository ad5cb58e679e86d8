package apply

import (
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxConditionMessage is the longest condition message the API accepts.
const MaxConditionMessage = 32768

// SetCondition is the one way a reconciler sets a condition on the status
// it computes: the transition time moves only when the status does (now,
// truncated to the second, as the API stores it), and a message too long
// for the API is cut on a character boundary.
func SetCondition(conds *[]metav1.Condition, t string, s metav1.ConditionStatus, reason, msg string, generation int64, now time.Time) {
	meta.SetStatusCondition(conds, metav1.Condition{Type: t, Status: s, Reason: reason, Message: TruncateMessage(msg),
		ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))})
}

// TruncateMessage cuts msg to what a condition message accepts.
func TruncateMessage(msg string) string { return Truncate(msg, MaxConditionMessage) }

// Truncate cuts s to at most n bytes, on a character boundary, marking the
// cut with an ellipsis.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	more := "…"
	if n < len(more) {
		more = "" // no room for the mark
	}
	cut := max(n-len(more), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}
