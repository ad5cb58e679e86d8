package training

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// expectationTTL bounds how long a create or delete the cache has not shown
// yet is trusted; past it the cache is believed (a lost watch event then
// costs one AlreadyExists, never a duplicate: pod names are deterministic).
const expectationTTL = time.Minute

// expectations remember, per job, the pods this manager created or deleted
// that the cache does not show yet, so that a stale cache neither creates a
// pod twice nor mistakes a fresh pod for a vanished one.
type expectations struct {
	mu      sync.Mutex
	creates map[types.NamespacedName]map[string]expected
	deletes map[types.NamespacedName]map[types.UID]time.Time
}

type expected struct {
	pod *corev1.Pod
	at  time.Time
}

func newExpectations() *expectations {
	return &expectations{creates: map[types.NamespacedName]map[string]expected{}, deletes: map[types.NamespacedName]map[types.UID]time.Time{}}
}

func (e *expectations) created(job types.NamespacedName, pod *corev1.Pod, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.creates[job] == nil {
		e.creates[job] = map[string]expected{}
	}
	e.creates[job][pod.Name] = expected{pod: pod, at: now}
}

func (e *expectations) createFailed(job types.NamespacedName, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.creates[job], name)
}

func (e *expectations) deleted(job types.NamespacedName, uid types.UID, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.deletes[job] == nil {
		e.deletes[job] = map[types.UID]time.Time{}
	}
	e.deletes[job][uid] = now
}

func (e *expectations) forget(job types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.creates, job)
	delete(e.deletes, job)
}

// overlay returns the cached pods as the manager knows them to be: pods it
// deleted are marked as terminating, pods it created that the cache lacks
// are added. Expectations the cache has caught up with are dropped.
func (e *expectations) overlay(job types.NamespacedName, cached []*corev1.Pod, now time.Time) []*corev1.Pod {
	e.mu.Lock()
	defer e.mu.Unlock()
	creates, deletes := e.creates[job], e.deletes[job]
	if len(creates) == 0 && len(deletes) == 0 {
		return cached
	}
	out := make([]*corev1.Pod, 0, len(cached)+len(creates))
	seen := make(map[string]bool, len(cached))
	live := map[types.UID]bool{}
	for _, p := range cached {
		live[p.UID] = true
		if at, ok := deletes[p.UID]; ok && p.DeletionTimestamp == nil && now.Sub(at) < expectationTTL {
			p = p.DeepCopy()
			t := metav1.NewTime(at)
			p.DeletionTimestamp = &t
		}
		seen[p.Name] = true
		if x, ok := creates[p.Name]; ok && p.Labels[LabelAttempt] == x.pod.Labels[LabelAttempt] {
			delete(creates, p.Name)
		}
		out = append(out, p)
	}
	for uid, at := range deletes {
		if !live[uid] || now.Sub(at) >= expectationTTL {
			delete(deletes, uid)
		}
	}
	for name, x := range creates {
		if now.Sub(x.at) >= expectationTTL {
			delete(creates, name)
			continue
		}
		if !seen[name] {
			out = append(out, x.pod)
		}
	}
	return out
}
