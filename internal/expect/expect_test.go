package expect

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func pod(name, uid string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}}
}

func TestOverlay(t *testing.T) {
	e := New()
	owner := types.NamespacedName{Namespace: "ns", Name: "o"}
	now := time.Now()
	e.Created(owner, pod("new", ""), now)
	e.Deleted(owner, "u-old", now)
	cached := []*corev1.Pod{pod("old", "u-old"), pod("other", "u-other")}

	got := e.Overlay(owner, "", cached, now, nil)
	if len(got) != 3 || got[2].Name != "new" {
		t.Fatalf("overlay %v: want the created pod added", names(got))
	}
	if got[0].DeletionTimestamp == nil || cached[0].DeletionTimestamp != nil {
		t.Fatal("the deleted pod must look terminating, without touching the cached object")
	}
	// The cache catches up: nothing is added or marked any more.
	got = e.Overlay(owner, "", []*corev1.Pod{pod("other", "u-other"), pod("new", "u-new")}, now, nil)
	if len(got) != 2 || got[0].DeletionTimestamp != nil || got[1].DeletionTimestamp != nil {
		t.Fatalf("after the cache caught up: %v", names(got))
	}
	if got := e.Overlay(owner, "", nil, now, nil); len(got) != 0 {
		t.Fatalf("satisfied expectations linger: %v", names(got))
	}

	// Past the TTL the cache is believed.
	e.Created(owner, pod("lost", ""), now.Add(-2*TTL))
	if got := e.Overlay(owner, "", nil, now, nil); len(got) != 0 {
		t.Fatalf("expired expectation still applied: %v", names(got))
	}
	// same decides whether a reused name is the created pod.
	e.Created(owner, pod("reused", ""), now)
	differs := func(_, _ *corev1.Pod) bool { return false }
	if got := e.Overlay(owner, "", []*corev1.Pod{pod("reused", "u-older")}, now, differs); len(got) != 1 {
		t.Fatalf("reused name: %v", names(got))
	}
	if got := e.Overlay(owner, "", []*corev1.Pod{pod("reused", "u-new")}, now, nil); len(got) != 1 {
		t.Fatalf("matched: %v", names(got))
	}
	e.Forget(owner)
	if got := e.Overlay(owner, "", nil, now, nil); len(got) != 0 {
		t.Fatalf("after Forget: %v", names(got))
	}
}

// An owner deleted and made again under its name (kubectl replace
// --force, delete then apply) before a pass saw it gone does not inherit
// the pods its predecessor created: they are controlled by the old UID,
// the cache never shows them as the new owner's, and they must not stand
// in for the new owner's pods until the TTL runs out.
func TestOverlayIgnoresAPreviousOwnersCreates(t *testing.T) {
	e := New()
	owner := types.NamespacedName{Namespace: "ns", Name: "o"}
	now := time.Now()
	old := pod("o-worker-0", "")
	old.OwnerReferences = []metav1.OwnerReference{{Kind: "TrainingJob", Name: "o", UID: "uid-old", Controller: ptr(true)}}
	e.Created(owner, old, now)
	if got := e.Overlay(owner, "uid-old", nil, now, nil); len(got) != 1 {
		t.Fatalf("the owner that created it: overlay %v, want its pod", names(got))
	}
	if got := e.Overlay(owner, "uid-new", nil, now, nil); len(got) != 0 {
		t.Fatalf("a new owner of the same name: overlay %v, want none of its predecessor's pods", names(got))
	}
	if got := e.Overlay(owner, "uid-old", nil, now, nil); len(got) != 0 {
		t.Fatalf("the predecessor's expectation lingers: %v", names(got))
	}
}

func ptr[T any](v T) *T { return &v }

func names(ps []*corev1.Pod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// Observed ends a create's expectation when the informer shows that pod
// created for that owner; not a pod of the name another object controls,
// not one same says is another, not one without a controller.
func TestObserved(t *testing.T) {
	owner := types.NamespacedName{Namespace: "ns", Name: "o"}
	controlled := func(name, ownerUID string) *corev1.Pod {
		p := pod(name, "u-"+name)
		p.OwnerReferences = []metav1.OwnerReference{{Name: "o", UID: types.UID(ownerUID), Controller: new(true)}}
		return p
	}
	differs := func(_, _ *corev1.Pod) bool { return false }
	for _, tt := range []struct {
		name   string
		seen   *corev1.Pod
		same   func(cached, created *corev1.Pod) bool
		expect int
	}{
		{"the created pod", controlled("p", "owner-uid"), nil, 0},
		{"another object's pod of the name", controlled("p", "other-uid"), nil, 1},
		{"same says it is another", controlled("p", "owner-uid"), differs, 1},
		{"no controller", pod("p", "u-p"), nil, 1},
		{"another name", controlled("q", "owner-uid"), nil, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := New()
			e.Created(owner, controlled("p", "owner-uid"), time.Now())
			e.Observed(owner, tt.seen, tt.same)
			if got := e.Expected(owner); got != tt.expect {
				t.Fatalf("expected %d, want %d", got, tt.expect)
			}
		})
	}
}
