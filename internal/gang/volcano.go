package gang

import (
	"context"
	"errors"
	"fmt"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
)

// ErrNotServedYet: the PodGroup CRD exists but the API server does not serve
// the kind yet (a CRD just created); retry in a moment.
var ErrNotServedYet = errors.New("the PodGroup CRD is not served yet")

// IsCRD selects the PodGroup CRD in a (metadata-only) CRD watch, through
// which a controller learns that Volcano was installed.
var IsCRD = predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == CRDName })

// Volcano tells a controller whether Volcano's PodGroup CRD is installed
// and served. The first time it is, it starts the controller's PodGroup
// watch: watching a kind whose CRD is missing would fail the manager's start,
// so the watch begins only then, without a restart.
type Volcano struct {
	Client     client.Client // reads through the manager's cache
	Cache      cache.Cache
	Controller controller.Controller
	// Owner is the kind whose PodGroups are watched (a TrainingJob, a
	// RayCluster); events go to the owning object.
	Owner client.Object
	// Scheme of the owner.
	Scheme *runtime.Scheme

	mu       sync.Mutex
	watching bool
}

// Installed reports whether PodGroups can be used now.
func (v *Volcano) Installed(ctx context.Context) (bool, error) {
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	if err := v.Client.Get(ctx, client.ObjectKey{Name: CRDName}, crd); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	gvk := schedulingv1beta1.SchemeGroupVersion.WithKind("PodGroup")
	if _, err := v.Client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
		if meta.IsNoMatchError(err) {
			return false, ErrNotServedYet
		}
		return false, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.watching {
		src := source.Kind(v.Cache, &schedulingv1beta1.PodGroup{},
			handler.TypedEnqueueRequestForOwner[*schedulingv1beta1.PodGroup](v.Scheme, v.Client.RESTMapper(), v.Owner, handler.OnlyControllerOwner()))
		if err := v.Controller.Watch(src); err != nil {
			return false, fmt.Errorf("watching PodGroups: %w", err)
		}
		v.watching = true
	}
	return true, nil
}
