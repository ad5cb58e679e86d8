package apply

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// StatusOption changes one status write.
type StatusOption func(*statusWrite)

type statusWrite struct {
	countsOnly bool
	progress   bool
	guarded    bool
}

// CountsOnly marks a change that moves only counts and messages: it waits
// until CoalesceInterval has passed since the object's last status write.
func CountsOnly(yes bool) StatusOption { return func(s *statusWrite) { s.countsOnly = yes } }

// Progress marks a change that only records progress towards what the
// object already asks for (a new object's pods being created, scheduled,
// started), with no failure and no verdict a person must act on: it waits
// until CoalesceInterval has passed since the object's last status write,
// or, for an object whose status this writer has not written, since the
// first such write was held back. A new object whose pods come up within
// the interval then gets one status write, not two. When more than
// ProgressBudget objects of the writer converge at once, the interval
// grows with their number.
func Progress(yes bool) StatusOption { return func(s *statusWrite) { s.progress = yes } }

// Guarded sends obj's resourceVersion with the write, so that it fails
// with a conflict when obj changed since it was read: for a status that
// must not be computed from a stale copy.
func Guarded() StatusOption { return func(s *statusWrite) { s.guarded = true } }

// Status makes obj's status want, where old is the status obj carries (the
// cache's copy): nothing is written when they are equal, a count-only
// change may be held back (the returned duration is how long to wait
// before asking again), and the write is a server-side apply of want under
// the writer's field owner with only the conditions the writer owns.
// Conditions are a map by type, so another writer's condition survives
// this write even when the cached copy predates it; fields the writer no
// longer sets are removed, as with any apply.
func (w *Writer) Status(ctx context.Context, obj client.Object, old, want any, opts ...StatusOption) (time.Duration, error) {
	var s statusWrite
	for _, o := range opts {
		o(&s)
	}
	gvk, err := apiutil.GVKForObject(obj, w.c.Scheme())
	if err != nil {
		return 0, err
	}
	key := client.ObjectKeyFromObject(obj)
	if !s.progress {
		w.statuses.settled(key)
	}
	if equality.Semantic.DeepEqual(old, want) {
		count(gvk.Kind, w.fieldOwner, "status", "skipped")
		return 0, nil
	}
	if wait := s.hold(&w.statuses, key); wait > 0 {
		count(gvk.Kind, w.fieldOwner, "status", "coalesced")
		return wait, nil
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(want)
	if err != nil {
		return 0, err
	}
	dropNulls(m)
	if conds, ok := m["conditions"].([]any); ok {
		m["conditions"] = slices.DeleteFunc(conds, func(c any) bool {
			t, _ := c.(map[string]any)["type"].(string)
			return !slices.Contains(w.opts.Conditions, t)
		})
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": m}}
	u.SetGroupVersionKind(gvk)
	u.SetName(obj.GetName())
	u.SetNamespace(obj.GetNamespace())
	if s.guarded {
		u.SetResourceVersion(obj.GetResourceVersion())
	}
	log.FromContext(ctx).V(1).Info("status", "kind", gvk.Kind, "object", key, "fieldOwner", w.fieldOwner, "why", statusWhy(s))
	if err := w.c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(w.fieldOwner), client.ForceOwnership); err != nil {
		count(gvk.Kind, w.fieldOwner, "status", "error")
		return 0, fmt.Errorf("writing %s status: %w", gvk.Kind, err)
	}
	count(gvk.Kind, w.fieldOwner, "status", "written")
	w.statuses.wrote(key)
	return 0, nil
}

// hold is how long the write must wait before it is sent (0: now).
func (s statusWrite) hold(c *coalesceWrites, key types.NamespacedName) time.Duration {
	switch {
	case s.progress:
		return c.waitProgress(key, time.Now())
	case s.countsOnly:
		return c.wait(key)
	}
	return 0
}

func statusWhy(s statusWrite) string {
	switch {
	case s.progress:
		return "progress recorded"
	case s.countsOnly:
		return "counts changed"
	}
	return "status changed"
}

// dropNulls removes null fields (nil pointers without omitempty) and empty
// objects (zero structs) from an apply: the server rejects the first and
// turns the second into null, and leaving a field out of an apply is how
// its owner removes it.
func dropNulls(m map[string]any) {
	for k, v := range m {
		switch v := v.(type) {
		case nil:
			delete(m, k)
		case map[string]any:
			dropNulls(v)
			if len(v) == 0 { // an empty struct: owning it while empty makes the server store null
				delete(m, k)
			}
		case []any:
			if v == nil {
				delete(m, k)
				continue
			}
			for _, e := range v {
				if em, ok := e.(map[string]any); ok {
					dropNulls(em)
				}
			}
		}
	}
}
