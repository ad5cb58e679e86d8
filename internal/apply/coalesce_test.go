package apply

import (
	"fmt"
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

// Many objects converging at once share the progress budget: each one's
// interval grows with their number; one that settles, or is forgotten, no
// longer counts, and one long silent stops counting.
func TestCoalesceProgressBudget(t *testing.T) {
	var w coalesceWrites
	t0 := time.Now()
	key := func(i int) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: fmt.Sprint(i)} }
	for i := range ProgressBudget {
		if d := w.waitProgress(key(i), t0); d != CoalesceInterval {
			t.Fatalf("object %d of %d converging: wait %s, want %s", i+1, ProgressBudget, d, CoalesceInterval)
		}
	}
	n := 4 * ProgressBudget
	for i := ProgressBudget; i < n; i++ {
		w.waitProgress(key(i), t0)
	}
	if d := w.waitProgress(key(0), t0); d != 4*CoalesceInterval {
		t.Fatalf("%d converging, held since now: wait %s, want %s", n, d, 4*CoalesceInterval)
	}
	if d := w.waitProgress(key(0), t0.Add(CoalesceInterval)); d != 3*CoalesceInterval {
		t.Fatalf("%d converging, held an interval ago: wait %s, want %s", n, d, 3*CoalesceInterval)
	}
	w.wrote(key(0))
	if d := w.waitProgress(key(0), time.Now()); d <= 3*CoalesceInterval || d > 4*CoalesceInterval {
		t.Fatalf("%d converging, just written: wait %s, want about %s", n, d, 4*CoalesceInterval)
	}
	// However many converge, an object's progress is at most
	// maxProgressInterval old.
	crowd, crowdSize := types.NamespacedName{Namespace: "crowd"}, 2*ProgressBudget*int(maxProgressInterval/CoalesceInterval)
	for i := range crowdSize {
		crowd.Name = fmt.Sprint(i)
		w.waitProgress(crowd, t0)
	}
	if d := w.waitProgress(key(n-1), t0); d != maxProgressInterval {
		t.Fatalf("%d converging: wait %s, want the cap %s", len(w.converging), d, maxProgressInterval)
	}
	for i := range crowdSize {
		crowd.Name = fmt.Sprint(i)
		w.forget(crowd)
	}
	for i := range 2 * ProgressBudget {
		if i%2 == 0 {
			w.settled(key(i))
		} else {
			w.forget(key(i))
		}
	}
	if d := w.waitProgress(key(n-1), t0); d != 2*CoalesceInterval {
		t.Fatalf("half settled or forgotten: wait %s, want %s", d, 2*CoalesceInterval)
	}
	// Those that stopped asking long ago are dropped, and the budget is
	// the one object's again.
	late := t0.Add(staleProgress + 2*time.Minute)
	if d := w.waitProgress(key(n-1), late); d != 0 {
		t.Fatalf("alone after the others went silent, held long ago: wait %s, want 0", d)
	}
	if got := len(w.converging); got != 1 {
		t.Fatalf("%d objects still counted converging, want 1", got)
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
