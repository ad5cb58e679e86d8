package why

import (
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"
)

// eventTime is when an event last happened.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// Warnings are the last n Warning events among events, oldest first, each as
// "<age> ago <reason>: <message>" (with its count when repeated).
func Warnings(events []corev1.Event, n int, now time.Time) []string {
	var ws []*corev1.Event
	for i := range events {
		if events[i].Type == corev1.EventTypeWarning {
			ws = append(ws, &events[i])
		}
	}
	sort.SliceStable(ws, func(i, j int) bool { return eventTime(ws[i]).Before(eventTime(ws[j])) })
	if len(ws) > n {
		ws = ws[len(ws)-n:]
	}
	out := make([]string, 0, len(ws))
	for _, e := range ws {
		count := e.Count
		if e.Series != nil && e.Series.Count > count {
			count = e.Series.Count
		}
		times := ""
		if count > 1 {
			times = fmt.Sprintf(" (x%d)", count)
		}
		out = append(out, fmt.Sprintf("%s ago %s%s: %s", Age(eventTime(e), now), e.Reason, times, OneLine(e.Message)))
	}
	return out
}

// Age is kubectl's short age of t at now ("<unknown>" for no time).
func Age(t, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}
