package apply

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestCoalesceWrites(t *testing.T) {
	var w coalesceWrites
	k := types.NamespacedName{Namespace: "ns", Name: "a"}
	if w.wait(k) != 0 {
		t.Fatal("a never-written object waits")
	}
	w.wrote(k)
	if d := w.wait(k); d <= 0 || d > CoalesceInterval {
		t.Fatalf("just written: wait %s", d)
	}
	w.forget(k)
	if w.wait(k) != 0 {
		t.Fatal("a forgotten object waits")
	}
}

func TestCoalesceProgress(t *testing.T) {
	var w coalesceWrites
	k := types.NamespacedName{Namespace: "ns", Name: "a"}
	t0 := time.Now()
	if d := w.waitProgress(k, t0); d != CoalesceInterval {
		t.Fatalf("first progress write of a never-written object: wait %s, want %s", d, CoalesceInterval)
	}
	if d := w.waitProgress(k, t0.Add(time.Second)); d != CoalesceInterval-time.Second {
		t.Fatalf("held a second ago: wait %s, want the rest of the interval from the first hold", d)
	}
	if d := w.waitProgress(k, t0.Add(CoalesceInterval)); d != 0 {
		t.Fatalf("held an interval ago: wait %s, want 0", d)
	}
	w.wrote(k)
	if d := w.waitProgress(k, time.Now()); d <= 0 || d > CoalesceInterval {
		t.Fatalf("just written: wait %s", d)
	}
	if w.wait(k) <= 0 {
		t.Fatal("a count-only write right after a write does not wait")
	}
	w.forget(k)
	if _, ok := w.held[k]; ok {
		t.Fatal("forget kept the hold")
	}
}

func TestSameConditions(t *testing.T) {
	a := []metav1.Condition{{Type: "Ready", Status: "False", Reason: "Pending", Message: "1 of 4"}}
	if !SameConditions(a, []metav1.Condition{{Type: "Ready", Status: "False", Reason: "Pending", Message: "3 of 4"}}) {
		t.Error("a message change is not a new condition")
	}
	for _, b := range [][]metav1.Condition{
		{{Type: "Ready", Status: "True", Reason: "Pending"}},
		{{Type: "Ready", Status: "False", Reason: "Other"}},
		{{Type: "Ready", Status: "False", Reason: "Pending"}, {Type: "X", Status: "True", Reason: "Y"}},
		nil,
	} {
		if SameConditions(a, b) {
			t.Errorf("%v counted the same as %v", b, a)
		}
	}
}
