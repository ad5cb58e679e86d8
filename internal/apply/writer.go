package apply

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/util/csaupgrade"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// The label every object Loom creates carries, for the whole project: the
// manager's cache selects Loom's Services by it, and a child without it (or
// without Loom's controller reference) is never overwritten or deleted.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "loom"
)

// AnnotationHash is the hash of everything a writer applied to a child
// (labels, annotations, owner references, spec or data): the cache shows
// whether the child is what the writer wants without comparing fields.
const AnnotationHash = "loom.dev/applied-hash"

// Hash is Loom's one hash: a short, stable digest of v's JSON (sha256,
// 16 hex digits). Pod template hashes, config hashes and children's
// applied hashes all use it.
func Hash(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain API data is hashed; a value that cannot be encoded
		// is a programming error, and a distinct hash keeps it visible.
		b = []byte(err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Options configure a Writer.
type Options struct {
	// Live reads around the cache when the cache does not show a child
	// about to be created: the cache may hold only Loom's objects of a
	// kind (Services), and a user's object of the same name must not be
	// taken over. Nil trusts the cache.
	Live client.Reader
	// Conditions are the status condition types this writer owns. A status
	// write applies these and leaves every other type to its own writer.
	Conditions []string
	// MetadataOnly are the kinds the manager caches as metadata only: the
	// writer reads them as PartialObjectMetadata.
	MetadataOnly []schema.GroupKind
	// SpecOnly are the kinds whose generation moves with their status (a
	// CRD without a status subresource, such as Volcano's PodGroup): the
	// writer compares their spec with the one the server answered to its
	// last apply, instead of reading every status change as another
	// writer's edit.
	SpecOnly []schema.GroupKind
}

// Writer is the one way a reconciler writes: its children (Ensure, Remove)
// and its status (Status), all under one field owner, each write logged at
// debug level with its reason and counted in loom_writes_total.
type Writer struct {
	c          client.Client
	fieldOwner string
	opts       Options
	statuses   coalesceWrites

	mu      sync.Mutex
	applied map[childKey]record
}

type childKey struct {
	gk  schema.GroupKind
	key types.NamespacedName
}

// record is what the server answered to the writer's last apply of a
// child: a later difference means another writer changed it since.
type record struct {
	owner      types.UID
	ownerKey   types.NamespacedName
	hash       string
	generation int64
	version    string
	spec       string // specHash of the server's answer (SpecOnly kinds)
}

// NewWriter returns a writer for fieldOwner.
func NewWriter(c client.Client, fieldOwner string, opts Options) *Writer {
	return &Writer{c: c, fieldOwner: fieldOwner, opts: opts, applied: map[childKey]record{}}
}

// FieldOwner is the writer's server-side apply field owner.
func (w *Writer) FieldOwner() string { return w.fieldOwner }

// ForeignError: an object of a child's name exists and Loom does not
// control it. Loom leaves it alone; the reconciler reports the conflict.
type ForeignError struct {
	Kind, Key, Reason string
}

func (e *ForeignError) Error() string {
	return fmt.Sprintf("%s %s exists and %s; Loom leaves it alone", e.Kind, e.Key, e.Reason)
}

// IsForeign reports whether err is (or wraps) a ForeignError.
func IsForeign(err error) bool {
	var f *ForeignError
	return errors.As(err, &f)
}

// Ensure makes the child named like want match want, controlled by owner
// (nil: no owner reference). It writes only when the cache shows the child
// missing, different from what this writer last applied, or changed by
// another writer since; an object of the name that Loom does not control is
// a ForeignError and is not touched.
func (w *Writer) Ensure(ctx context.Context, owner, want client.Object) error {
	_, err := w.EnsureNew(ctx, owner, want)
	return err
}

// EnsureNew is Ensure, reporting whether this call created the child: a
// create that finds it made already (a cache behind an earlier pass's
// create) is not one, so a "Created" event is recorded once.
func (w *Writer) EnsureNew(ctx context.Context, owner, want client.Object) (created bool, err error) {
	gvk, err := apiutil.GVKForObject(want, w.c.Scheme())
	if err != nil {
		return false, err
	}
	if owner != nil {
		ref, err := controllerRef(w.c, owner)
		if err != nil {
			return false, err
		}
		want.SetOwnerReferences([]metav1.OwnerReference{ref})
	}
	labels := want.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelManagedBy] = ManagedBy
	want.SetLabels(labels)
	annotations := want.GetAnnotations()
	delete(annotations, AnnotationHash)
	hash := Hash(want)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[AnnotationHash] = hash
	want.SetAnnotations(annotations)

	ck := childKey{gk: gvk.GroupKind(), key: client.ObjectKeyFromObject(want)}
	u, err := ToUnstructured(want)
	if err != nil {
		return false, err
	}
	u.SetGroupVersionKind(gvk)
	cur, err := w.read(ctx, w.c, gvk, ck.key)
	if err != nil {
		return false, err
	}
	if cur == nil && w.opts.Live != nil {
		var done bool
		if cur, done, err = w.created(ctx, ck, gvk, u, owner); done {
			if err == nil {
				w.remember(ck, gvk, owner, hash, u)
			}
			return err == nil, err
		}
	}
	why := "create"
	if cur != nil {
		if err := predecessors(gvk, ck.key, cur, want); err != nil {
			return false, err
		}
		if reason := foreign(cur, owner); reason != "" {
			return false, &ForeignError{Kind: gvk.Kind, Key: ck.key.String(), Reason: reason}
		}
		if why = w.stale(ctx, ck, cur, u, owner, hash); why == "" {
			count(gvk.Kind, w.fieldOwner, "apply", "skipped")
			return false, nil
		}
		if cur.GetAnnotations()[AnnotationHash] != hash {
			if err := w.upgradeCreated(ctx, gvk, ck.key); err != nil {
				return false, err
			}
		}
	}
	log.FromContext(ctx).V(1).Info("apply", "kind", gvk.Kind, "object", ck.key, "fieldOwner", w.fieldOwner, "why", why)
	if err := w.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(w.fieldOwner), client.ForceOwnership); err != nil {
		count(gvk.Kind, w.fieldOwner, "apply", "error")
		return false, fmt.Errorf("applying %s %s: %w", gvk.Kind, ck.key, err)
	}
	count(gvk.Kind, w.fieldOwner, "apply", "written")
	w.remember(ck, gvk, owner, hash, u)
	return cur == nil, nil
}

// remember records what the server answered (u) to a write of a child.
func (w *Writer) remember(ck childKey, gvk schema.GroupVersionKind, owner client.Object, hash string, u *unstructured.Unstructured) {
	rec := record{owner: uidOf(owner), ownerKey: keyOf(owner), hash: hash, generation: u.GetGeneration(), version: u.GetResourceVersion()}
	if slices.Contains(w.opts.SpecOnly, ck.gk) {
		rec.spec = w.answeredSpec(gvk, u)
	}
	w.mu.Lock()
	w.applied[ck] = rec
	w.mu.Unlock()
}

// adopt records cur, a child that carries this writer's hash though this
// writer did not apply it, as if the server had answered it to an apply.
func (w *Writer) adopt(ck childKey, cur, owner client.Object, hash string) {
	rec := record{owner: uidOf(owner), ownerKey: keyOf(owner), hash: hash, generation: cur.GetGeneration(), version: cur.GetResourceVersion()}
	if slices.Contains(w.opts.SpecOnly, ck.gk) {
		if _, partial := cur.(*metav1.PartialObjectMetadata); partial {
			return // read around the cache for its metadata only: no spec to compare later
		}
		rec.spec = specHash(cur)
	}
	w.mu.Lock()
	w.applied[ck] = rec
	w.mu.Unlock()
}

// ApplyFields server-side applies exactly the fields obj carries, under the
// writer's field owner, to an object Loom does not own (a Node's labels, a
// CRD Loom installs, the GPUNode a node agent creates): no ownership, hash
// or label of Loom's is added. force takes over fields another field owner
// set. The caller decides from the cache that the write is needed.
func (w *Writer) ApplyFields(ctx context.Context, obj *unstructured.Unstructured, force bool, why string) error {
	gvk := obj.GroupVersionKind()
	key := client.ObjectKeyFromObject(obj)
	log.FromContext(ctx).V(1).Info("apply", "kind", gvk.Kind, "object", key, "fieldOwner", w.fieldOwner, "why", why)
	opts := []client.ApplyOption{client.FieldOwner(w.fieldOwner)}
	if force {
		opts = append(opts, client.ForceOwnership)
	}
	if err := w.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), opts...); err != nil {
		count(gvk.Kind, w.fieldOwner, "apply", "error")
		return fmt.Errorf("applying %s %s: %w", gvk.Kind, key, err)
	}
	count(gvk.Kind, w.fieldOwner, "apply", "written")
	return nil
}

// ApplyRaw applies body, the whole manifest of obj's kind and name as JSON,
// server-side and forced, as the writer's field owner; obj receives the
// response (a PartialObjectMetadata reads back only metadata). For
// manifests too large to hold as objects: third-party CRDs.
func (w *Writer) ApplyRaw(ctx context.Context, obj client.Object, body []byte, why string) error {
	gvk, err := apiutil.GVKForObject(obj, w.c.Scheme())
	if err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(obj)
	log.FromContext(ctx).V(1).Info("apply", "kind", gvk.Kind, "object", key, "fieldOwner", w.fieldOwner, "why", why)
	if err := w.c.Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, body), client.FieldOwner(w.fieldOwner), client.ForceOwnership); err != nil {
		count(gvk.Kind, w.fieldOwner, "apply", "error")
		return fmt.Errorf("applying %s %s: %w", gvk.Kind, key, err)
	}
	count(gvk.Kind, w.fieldOwner, "apply", "written")
	return nil
}

// Patch sends patch for obj, an object Loom does not own (a Node it
// cordons and marks with its upgrade state), counted and logged like every
// other write. A merge patch leaves the fields it does not name to their
// owners, as kubectl cordon does.
func (w *Writer) Patch(ctx context.Context, obj client.Object, patch client.Patch, why string) error {
	gvk, err := apiutil.GVKForObject(obj, w.c.Scheme())
	if err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(obj)
	log.FromContext(ctx).V(1).Info("patch", "kind", gvk.Kind, "object", key, "fieldOwner", w.fieldOwner, "why", why)
	if err := w.c.Patch(ctx, obj, patch, client.FieldOwner(w.fieldOwner)); err != nil {
		count(gvk.Kind, w.fieldOwner, "patch", "error")
		return fmt.Errorf("patching %s %s: %w", gvk.Kind, key, err)
	}
	count(gvk.Kind, w.fieldOwner, "patch", "written")
	return nil
}

// stale says why the cached child cur needs a write, or "" when it is
// exactly what this writer wants (want, as it is applied).
func (w *Writer) stale(ctx context.Context, ck childKey, cur client.Object, want *unstructured.Unstructured, owner client.Object, hash string) string {
	if cur.GetAnnotations()[AnnotationHash] != hash {
		return "desired state changed"
	}
	if !hasOwners(cur.GetOwnerReferences(), want.GetOwnerReferences()) {
		return "owner references differ"
	}
	for k, v := range want.GetLabels() {
		if cur.GetLabels()[k] != v {
			return "labels differ"
		}
	}
	for k, v := range want.GetAnnotations() {
		if cur.GetAnnotations()[k] != v {
			return "annotations differ"
		}
	}
	w.mu.Lock()
	rec, known := w.applied[ck]
	w.mu.Unlock()
	switch {
	case !known || rec.hash != hash:
		// Applied before a restart (or by another replica): the hash says
		// what was applied. A field of it edited since (while no writer
		// watched) is put back now; otherwise what the cache shows is the
		// baseline, so that an edit made from here on is put back, as
		// after an apply of this writer's. A kind cached as metadata only
		// is read whole once (live) for it.
		if path := drift(w.whole(ctx, ck, cur), want); path != "" {
			return path + " differs from what was applied"
		}
		w.adopt(ck, cur, owner, hash)
		return ""
	case slices.Contains(w.opts.SpecOnly, ck.gk):
		if specHash(cur) != rec.spec {
			return "spec changed by another writer"
		}
		return ""
	case cur.GetGeneration() > 0 && cur.GetGeneration() != rec.generation:
		return "spec changed by another writer"
	case cur.GetGeneration() == 0 && cur.GetResourceVersion() != rec.version:
		return "changed by another writer"
	}
	return ""
}

// Remove deletes obj's namesake (obj names the kind and key) when Loom
// controls it: owned by owner, or labelled Loom's with no controller. The
// delete carries the cached UID as a precondition and propagates in the
// background.
func (w *Writer) Remove(ctx context.Context, owner, obj client.Object) error {
	gvk, err := apiutil.GVKForObject(obj, w.c.Scheme())
	if err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(obj)
	cur, err := w.read(ctx, w.c, gvk, key)
	if err != nil || cur == nil {
		return err
	}
	if foreign(cur, owner) != "" || cur.GetDeletionTimestamp() != nil {
		return nil
	}
	return w.Delete(ctx, cur, "no longer desired")
}

// Delete deletes cur (an object the caller has checked is Loom's) with its
// UID as a precondition, in the background. A child already gone, or
// replaced since it was read, is not an error.
func (w *Writer) Delete(ctx context.Context, cur client.Object, why string) error {
	gvk, err := apiutil.GVKForObject(cur, w.c.Scheme())
	if err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(cur)
	log.FromContext(ctx).V(1).Info("delete", "kind", gvk.Kind, "object", key, "fieldOwner", w.fieldOwner, "why", why)
	uid := cur.GetUID()
	err = w.c.Delete(ctx, cur, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		count(gvk.Kind, w.fieldOwner, "delete", "error")
		return fmt.Errorf("deleting %s %s: %w", gvk.Kind, key, err)
	}
	count(gvk.Kind, w.fieldOwner, "delete", "written")
	w.mu.Lock()
	delete(w.applied, childKey{gk: gvk.GroupKind(), key: key})
	w.mu.Unlock()
	return nil
}

// Forget drops what the writer remembers of owner and its children (the
// owner is gone; its children go with it). An owner already deleted, whose
// UID the caller no longer knows, may be named by its key alone (UID unset):
// then the children applied for an owner of that key are forgotten.
func (w *Writer) Forget(owner client.Object) {
	key := client.ObjectKeyFromObject(owner)
	w.statuses.forget(key)
	uid := owner.GetUID()
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, rec := range w.applied {
		if rec.owner != "" && (rec.owner == uid || uid == "" && rec.ownerKey == key) {
			delete(w.applied, k)
		}
	}
}

// created creates want (u, its unstructured form) with a POST when the cache
// does not show it and the cache may hold only Loom's objects of the kind
// (Live set): the create itself is the check that the name is free, so no
// read goes around the cache. done: the child is created (or the name is
// taken by an object Loom does not control: err is a ForeignError); not
// done: an object of the name is Loom's and not yet in the cache, cur,
// which the caller applies to as to any cached child.
func (w *Writer) created(ctx context.Context, ck childKey, gvk schema.GroupVersionKind, u *unstructured.Unstructured, owner client.Object) (cur client.Object, done bool, err error) {
	log.FromContext(ctx).V(1).Info("create", "kind", gvk.Kind, "object", ck.key, "fieldOwner", w.fieldOwner, "why", "not in the cache")
	err = w.c.Create(ctx, u, client.FieldOwner(w.fieldOwner))
	if err == nil {
		count(gvk.Kind, w.fieldOwner, "create", "written")
		return nil, true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		count(gvk.Kind, w.fieldOwner, "create", "error")
		return nil, true, fmt.Errorf("creating %s %s: %w", gvk.Kind, ck.key, err)
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	if err := w.opts.Live.Get(ctx, ck.key, m); err != nil {
		return nil, true, fmt.Errorf("reading %s %s, which a create found taken: %w", gvk.Kind, ck.key, err)
	}
	if err := predecessors(gvk, ck.key, m, u); err != nil {
		return nil, true, err
	}
	if reason := foreign(m, owner); reason != "" {
		return nil, true, &ForeignError{Kind: gvk.Kind, Key: ck.key.String(), Reason: reason}
	}
	return m, false, nil
}

// PredecessorError: a child's name is held by the child of an earlier
// owner of the same kind and name, deleted since (the owner was deleted and
// created again): the garbage collector removes it by itself, and the child
// is made anew then. It is no ForeignError: nothing needs a person.
type PredecessorError struct {
	Kind, Key  string
	OwnerKind  string
	OwnerName  string
	Owner, Was types.UID
}

func (e *PredecessorError) Error() string {
	return fmt.Sprintf("%s %s still belongs to the %s %s deleted before this one (uid %s): it is made anew once the garbage collector has removed it",
		e.Kind, e.Key, e.OwnerKind, e.OwnerName, e.Was)
}

// predecessors is a PredecessorError when cur, the object holding want's
// name, is controlled by an earlier object of the kind and name of want's
// controller.
func predecessors(gvk schema.GroupVersionKind, key types.NamespacedName, cur, want metav1.Object) error {
	ref := metav1.GetControllerOfNoCopy(want)
	if ref == nil || !Predecessor(cur, *ref) {
		return nil
	}
	was := metav1.GetControllerOfNoCopy(cur)
	return &PredecessorError{Kind: gvk.Kind, Key: key.String(), OwnerKind: ref.Kind, OwnerName: ref.Name, Owner: ref.UID, Was: was.UID}
}

// Predecessor reports whether obj's controller is an earlier object of
// the kind and name ref controls for (another UID): as names are unique,
// one deleted since its name was taken again, whose dependents the
// garbage collector removes by itself.
func Predecessor(obj metav1.Object, ref metav1.OwnerReference) bool {
	c := metav1.GetControllerOfNoCopy(obj)
	if c == nil || c.UID == ref.UID || c.Kind != ref.Kind || c.Name != ref.Name {
		return false
	}
	cg, err1 := schema.ParseGroupVersion(c.APIVersion)
	rg, err2 := schema.ParseGroupVersion(ref.APIVersion)
	return err1 == nil && err2 == nil && cg.Group == rg.Group
}

// upgradeCreated hands the fields of a child this writer created with a
// POST (recorded under its field owner as an update) to its server-side
// apply, before the first apply that changes it: otherwise a field the
// apply no longer sets would stay, still owned by the create. It reads the
// child's managed fields around the cache (the cache drops them); it runs
// only on the way to a write that changes the desired state, never in a
// steady state. A repair (the child carries the hash of what the writer
// wants, another party edited it) needs none: its apply sets every field
// the create set, so the create's record keeps none the apply drops.
func (w *Writer) upgradeCreated(ctx context.Context, gvk schema.GroupVersionKind, key types.NamespacedName) error {
	if w.opts.Live == nil {
		return nil
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	if err := w.opts.Live.Get(ctx, key, m); err != nil {
		return client.IgnoreNotFound(err)
	}
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(m, sets.New(w.fieldOwner), w.fieldOwner)
	if err != nil || patch == nil {
		return err
	}
	return w.Patch(ctx, m, client.RawPatch(types.JSONPatchType, patch), "hand the created fields to server-side apply")
}
