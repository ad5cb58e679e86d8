// Package optional lets a controller use a kind whose CRD may be installed
// after the manager started (Volcano's PodGroup, the Prometheus Operator's
// monitors). Watching a kind that is not served fails the manager's start,
// so the watch begins the first time the kind is served, without a restart;
// until then the controller reports that it waits for the CRD.
package optional

import (
	"context"
	"errors"
	"fmt"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// ErrNotServedYet: the CRD exists but the API server does not serve the kind
// yet (a CRD just created); retry in a moment.
var ErrNotServedYet = errors.New("the CRD is not served yet")

// Kind is one kind served by a CRD that may be missing.
type Kind struct {
	// CRD is the CustomResourceDefinition's name (plural.group).
	CRD string
	GVK schema.GroupVersionKind
	// Watch starts the controller's watches of the kind. It is called once,
	// the first time the kind is served.
	Watch func() error

	mu       sync.Mutex
	watching bool
}

// Served reports whether the kind can be used now, starting its watch the
// first time. c reads CRDs through the manager's (metadata) cache.
func (k *Kind) Served(ctx context.Context, c client.Client) (bool, error) {
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	if err := c.Get(ctx, client.ObjectKey{Name: k.CRD}, crd); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if _, err := c.RESTMapper().RESTMapping(k.GVK.GroupKind(), k.GVK.Version); err != nil {
		if meta.IsNoMatchError(err) {
			return false, fmt.Errorf("%s: %w", k.CRD, ErrNotServedYet)
		}
		return false, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.watching && k.Watch != nil {
		if err := k.Watch(); err != nil {
			return false, fmt.Errorf("watching %s: %w", k.GVK.Kind, err)
		}
		k.watching = true
	}
	return true, nil
}

// IsCRD selects the named CRDs in a metadata-only CRD watch, through which a
// controller learns that they were installed.
func IsCRD(names ...string) predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		for _, n := range names {
			if o.GetName() == n {
				return true
			}
		}
		return false
	})
}

// Watching reports whether the kind's watch has started.
func (k *Kind) Watching() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.watching
}
