package apply

// Coalescing spaces out status writes that only move counts and messages,
// or only record progress towards what the object already asks for: during
// a large rollout every pod event would otherwise cost one status write,
// and a new object whose pods come up within the interval gets one status
// write instead of two. Writes that change a verdict (a failure, a state
// reached, a condition's status or reason that is not progress) are never
// held back.
//
// Progress also shares a budget across the writer's objects: when many
// converge at once (a fleet of new RayClusters), each object's progress is
// reported less often, so that the writer sends at most ProgressBudget
// progress writes per CoalesceInterval, until no object's progress would
// be more than maxProgressInterval old; verdicts are still written at
// once.

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

// ProgressBudget is how many objects one writer reports progress of per
// CoalesceInterval (4 progress writes a second): with more converging at
// once, each object's progress interval grows in proportion (100 new
// objects: one progress write each per 25 s at most), up to
// maxProgressInterval (from 1,200 objects on). Progress is what a person
// watching a rollout reads, not what anything acts on (verdicts are
// written at once, and the workloads' metrics carry the live counts), so
// a burst of objects does not turn into a burst of writes that grows with
// it: 1,000 RayClusters created at once waited up to two minutes for the
// scheduler on a 2-core simulated cluster, and got 1,354 status writes with
// a budget of 32 and a one-minute cap, 1,146 with this budget.
const ProgressBudget = 8

// maxProgressInterval bounds the progress interval however many objects
// converge: a converging object's status is at most this old.
const maxProgressInterval = 5 * time.Minute

// staleProgress is how long an object that stopped asking for progress
// writes, without a verdict or a forget, still counts as converging.
const staleProgress = 10 * time.Minute

// coalesceWrites remembers when each object's status was last written.
// The zero value is ready to use; it is safe for concurrent use.
type coalesceWrites struct {
	mu   sync.Mutex
	last map[types.NamespacedName]time.Time
	// held is when a progress write of an object whose status was never
	// written was first held back.
	held map[types.NamespacedName]time.Time
	// converging is when each object converging (its last status write
	// asked was progress) last asked; pruned is when stale ones were last
	// dropped.
	converging map[types.NamespacedName]time.Time
	pruned     time.Time
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
// now): the progress interval after the last write, or, when none was
// written, after the first progress write held back. The interval is
// CoalesceInterval, longer when more than ProgressBudget objects converge
// at once.
func (w *coalesceWrites) waitProgress(key types.NamespacedName, now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	interval := w.progressInterval(key, now)
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
	if d := now.Sub(since); d < interval {
		return interval - d
	}
	return 0
}

// progressInterval counts key as converging and returns the least time
// between two progress writes of one object: CoalesceInterval, times the
// objects converging over ProgressBudget when there are more, up to
// maxProgressInterval. w.mu is held.
func (w *coalesceWrites) progressInterval(key types.NamespacedName, now time.Time) time.Duration {
	if w.converging == nil {
		w.converging = map[types.NamespacedName]time.Time{}
	}
	w.converging[key] = now
	if now.Sub(w.pruned) > time.Minute {
		w.pruned = now
		for k, t := range w.converging {
			if now.Sub(t) > staleProgress {
				delete(w.converging, k)
			}
		}
	}
	n := len(w.converging)
	if n <= ProgressBudget {
		return CoalesceInterval
	}
	return min(CoalesceInterval*time.Duration(n)/ProgressBudget, maxProgressInterval)
}

// settled records that key's status asked for a write that is not
// progress (a verdict, or nothing to change): it no longer counts as
// converging.
func (w *coalesceWrites) settled(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.converging, key)
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
	delete(w.converging, key)
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
