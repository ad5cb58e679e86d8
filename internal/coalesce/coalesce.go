// Package coalesce spaces out status writes that only move counts and
// messages: during a large rollout every pod event would otherwise cost one
// status write. Writes that change a state, a condition's status or reason
// are never held back.
package coalesce

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Interval is the least time between two count-only status writes of one
// object.
const Interval = 2 * time.Second

// Writes remembers when each object's status was last written. The zero
// value is ready to use; it is safe for concurrent use.
type Writes struct {
	mu   sync.Mutex
	last map[types.NamespacedName]time.Time
}

// Wait is how long a count-only write of key must still wait (0: now).
func (w *Writes) Wait(key types.NamespacedName) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if since := time.Since(w.last[key]); since < Interval {
		return Interval - since
	}
	return 0
}

// Wrote records a status write of key.
func (w *Writes) Wrote(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[types.NamespacedName]time.Time{}
	}
	w.last[key] = time.Now()
}

// Forget drops key (the object is gone).
func (w *Writes) Forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, key)
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
