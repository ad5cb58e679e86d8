package apply

// Coalescing spaces out status writes that only move counts and messages,
// or only record progress towards what the object already asks for: during
// a large rollout every pod event would otherwise cost one status write,
// and a new object whose pods come up within the interval gets one status
// write instead of two. Writes that change a verdict (a failure, a state
// reached, a condition's status or reason that is not progress) are never
// held back.

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// CoalesceInterval is the least time between two count-only status writes of one
// object.
const CoalesceInterval = 2 * time.Second

// coalesceWrites remembers when each object's status was last written.
// The zero value is ready to use; it is safe for concurrent use.
type coalesceWrites struct {
	mu   sync.Mutex
	last map[types.NamespacedName]time.Time
	// held is when a progress write of an object whose status was never
	// written was first held back.
	held map[types.NamespacedName]time.Time
}

// wait is how long a count-only write of key must still wait (0: now).
func (w *coalesceWrites) wait(key types.NamespacedName) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if since := time.Since(w.last[key]); since < CoalesceInterval {
		return CoalesceInterval - since
	}
	return 0
}

// waitProgress is how long a progress write of key must still wait (0:
// now): CoalesceInterval after the last write, or, when none was written,
// after the first progress write held back.
func (w *coalesceWrites) waitProgress(key types.NamespacedName, now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	since, ok := w.last[key]
	if !ok {
		if since, ok = w.held[key]; !ok {
			if w.held == nil {
				w.held = map[types.NamespacedName]time.Time{}
			}
			w.held[key] = now
			since = now
		}
	}
	if d := now.Sub(since); d < CoalesceInterval {
		return CoalesceInterval - d
	}
	return 0
}

// wrote records a status write of key.
func (w *coalesceWrites) wrote(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[types.NamespacedName]time.Time{}
	}
	w.last[key] = time.Now()
	delete(w.held, key)
}

// forget drops key (the object is gone).
func (w *coalesceWrites) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, key)
	delete(w.held, key)
}

// SameConditions reports whether two condition lists have the same types,
// statuses and reasons; messages and times may differ.
func SameConditions(old, cur []metav1.Condition) bool {
	if len(old) != len(cur) {
		return false
	}
	for _, c := range cur {
		o := meta.FindStatusCondition(old, c.Type)
		if o == nil || o.Status != c.Status || o.Reason != c.Reason {
			return false
		}
	}
	return true
}
