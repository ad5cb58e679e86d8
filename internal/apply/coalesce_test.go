package apply

import (
	"testing"

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
