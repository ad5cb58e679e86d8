package apply

// What the writer reads of a child and its owner: the cached child (whole
// or as metadata), whether Loom may write it, and the hashes it compares.

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

func (w *Writer) read(ctx context.Context, r client.Reader, gvk schema.GroupVersionKind, key types.NamespacedName) (client.Object, error) {
	var cur client.Object
	if w.metadataOnly(gvk.GroupKind()) {
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(gvk)
		cur = m
	} else {
		obj, err := w.c.Scheme().New(gvk)
		if err != nil {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gvk)
			obj = u
		}
		cur = obj.(client.Object)
	}
	if err := r.Get(ctx, key, cur); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return cur, nil
}

// whole is cur with its fields for drift: cur itself, or, for a kind
// cached as metadata only, the object read live (cur when it cannot be:
// then only the hash is trusted, as before a read).
func (w *Writer) whole(ctx context.Context, ck childKey, cur client.Object) client.Object {
	m, ok := cur.(*metav1.PartialObjectMetadata)
	if !ok || w.opts.Live == nil {
		return cur
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(m.GroupVersionKind())
	if err := w.opts.Live.Get(ctx, ck.key, u); err != nil {
		return cur
	}
	return u
}

func (w *Writer) metadataOnly(gk schema.GroupKind) bool {
	return slices.Contains(w.opts.MetadataOnly, gk)
}

// foreign says why cur is not Loom's to write ("" when it is): Loom writes
// what owner controls, and what carries Loom's label with no controller.
func foreign(cur, owner client.Object) string {
	ref := metav1.GetControllerOfNoCopy(cur)
	switch {
	case owner != nil && ref != nil && ref.UID == owner.GetUID():
		return ""
	case ref != nil:
		return fmt.Sprintf("is controlled by %s %s (uid %s)", ref.Kind, ref.Name, ref.UID)
	case cur.GetLabels()[LabelManagedBy] != ManagedBy:
		return fmt.Sprintf("is not managed by Loom (label %s=%s)", LabelManagedBy, ManagedBy)
	}
	return ""
}

func controllerRef(c client.Client, owner client.Object) (metav1.OwnerReference, error) {
	gvk, err := apiutil.GVKForObject(owner, c.Scheme())
	if err != nil {
		return metav1.OwnerReference{}, err
	}
	return *metav1.NewControllerRef(owner, gvk), nil
}

// hasOwners: cur carries every reference of want. A reference another
// party added beside Loom's is not Loom's (the apply keeps it: owner
// references are a map by UID), and must not read as a difference that a
// write would fix on every pass.
func hasOwners(cur, want []metav1.OwnerReference) bool {
	for _, w := range want {
		if !slices.ContainsFunc(cur, func(c metav1.OwnerReference) bool { return reflect.DeepEqual(c, w) }) {
			return false
		}
	}
	return true
}

func uidOf(o client.Object) types.UID {
	if o == nil || reflect.ValueOf(o).IsNil() {
		return ""
	}
	return o.GetUID()
}

func keyOf(o client.Object) types.NamespacedName {
	if uidOf(o) == "" {
		return types.NamespacedName{}
	}
	return client.ObjectKeyFromObject(o)
}

// specHash hashes obj's spec as a typed object converts it, so that the
// cached copy and the server's answer compare alike.
func specHash(obj client.Object) string {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return ""
	}
	return Hash(m["spec"])
}

// answeredSpec is specHash of the server's answer u, read into the kind's
// typed object first (as the cache holds it).
func (w *Writer) answeredSpec(gvk schema.GroupVersionKind, u *unstructured.Unstructured) string {
	typed, err := w.c.Scheme().New(gvk)
	if err != nil {
		return Hash(u.Object["spec"])
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, typed); err != nil {
		return ""
	}
	return specHash(typed.(client.Object))
}
