// Package expect remembers the pods a reconciler created or deleted that
// its cache does not show yet (controller expectations), so that a stale
// cache neither creates a pod twice nor mistakes a fresh pod for a lost one.
package expect

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TTL bounds how long a create or delete the cache has not shown
// yet is trusted; past it the cache is believed (a lost watch event then
// costs one AlreadyExists where names are deterministic, one extra pod at
// worst where they are generated).
const TTL = time.Minute

// Pods are the expectations of one reconciler, per owner.
type Pods struct {
	mu      sync.Mutex
	creates map[types.NamespacedName]map[string]expected
	deletes map[types.NamespacedName]map[types.UID]time.Time
}

type expected struct {
	pod *corev1.Pod
	at  time.Time
}

// New returns empty expectations.
func New() *Pods {
	return &Pods{creates: map[types.NamespacedName]map[string]expected{}, deletes: map[types.NamespacedName]map[types.UID]time.Time{}}
}

// Created records a pod about to be created.
func (e *Pods) Created(owner types.NamespacedName, pod *corev1.Pod, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.creates[owner] == nil {
		e.creates[owner] = map[string]expected{}
	}
	e.creates[owner][pod.Name] = expected{pod: pod, at: now}
}

// Observed drops the expectation of a created pod that the cache now
// shows (the pod informer's handler calls it with each pod added), so that
// the copy of a created pod is held until its watch event arrives, not
// until its owner's next pass: with many owners converging at once, their
// passes lag the watch by seconds, and 400 pods' copies were held at the
// peak. owner is the pod's controller's key; a pod of that name created
// for another object (its controller's UID differs), or that same says is
// not the one created, leaves the expectation to Overlay.
func (e *Pods) Observed(owner types.NamespacedName, pod *corev1.Pod, same func(cached, created *corev1.Pod) bool) {
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	creates := e.creates[owner]
	x, ok := creates[pod.Name]
	if !ok || !createdFor(x.pod, ref.UID) || (same != nil && !same(pod, x.pod)) {
		return
	}
	delete(creates, pod.Name)
	if len(creates) == 0 {
		delete(e.creates, owner)
	}
}

// Expected is how many pods created for owner the cache has not shown yet.
func (e *Pods) Expected(owner types.NamespacedName) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.creates[owner])
}

// CreateFailed forgets a pod whose creation failed.
func (e *Pods) CreateFailed(owner types.NamespacedName, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.creates[owner], name)
}

// Deleted records a pod deleted.
func (e *Pods) Deleted(owner types.NamespacedName, uid types.UID, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.deletes[owner] == nil {
		e.deletes[owner] = map[types.UID]time.Time{}
	}
	e.deletes[owner][uid] = now
}

// Forget drops an owner's expectations (the owner is gone).
func (e *Pods) Forget(owner types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.creates, owner)
	delete(e.deletes, owner)
}

// Overlay returns the cached pods as the manager knows them to be: pods it
// deleted are marked as terminating, pods it created that the cache lacks
// are added. Expectations the cache has caught up with are dropped. same
// tells whether a cached pod is the one created under its name (names may be
// reused, e.g. across a gang's attempts); nil means a name match suffices.
// uid is the owner's: a pod created for an earlier owner of the name (one
// deleted and made again before a pass saw it gone) is no longer expected.
func (e *Pods) Overlay(owner types.NamespacedName, uid types.UID, cached []*corev1.Pod, now time.Time, same func(cached, created *corev1.Pod) bool) []*corev1.Pod {
	e.mu.Lock()
	defer e.mu.Unlock()
	creates, deletes := e.creates[owner], e.deletes[owner]
	if len(creates) == 0 && len(deletes) == 0 {
		return cached
	}
	out := make([]*corev1.Pod, 0, len(cached)+len(creates))
	seen := make(map[string]bool, len(cached))
	live := map[types.UID]bool{}
	for _, p := range cached {
		live[p.UID] = true
		if at, ok := deletes[p.UID]; ok && p.DeletionTimestamp == nil && now.Sub(at) < TTL {
			p = p.DeepCopy()
			t := metav1.NewTime(at)
			p.DeletionTimestamp = &t
		}
		seen[p.Name] = true
		if x, ok := creates[p.Name]; ok && (same == nil || same(p, x.pod)) {
			delete(creates, p.Name)
		}
		out = append(out, p)
	}
	for uid, at := range deletes {
		if !live[uid] || now.Sub(at) >= TTL {
			delete(deletes, uid)
		}
	}
	for name, x := range creates {
		if now.Sub(x.at) >= TTL || !createdFor(x.pod, uid) {
			delete(creates, name)
			continue
		}
		if !seen[name] {
			out = append(out, x.pod)
		}
	}
	return out
}

// createdFor: pod was created for the owner of uid (or says nothing of
// its controller, or uid is unknown).
func createdFor(pod *corev1.Pod, uid types.UID) bool {
	ref := metav1.GetControllerOfNoCopy(pod)
	return uid == "" || ref == nil || ref.UID == uid
}
