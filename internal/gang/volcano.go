package gang

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/loom-dev/loom/internal/optional"
)

// ErrNotServedYet: the PodGroup CRD exists but the API server does not serve
// the kind yet (a CRD just created); retry in a moment.
var ErrNotServedYet = optional.ErrNotServedYet

// IsCRD selects the PodGroup CRD in a (metadata-only) CRD watch, through
// which a controller learns that Volcano was installed.
var IsCRD = optional.IsCRD(CRDName)

// Volcano tells a controller whether Volcano's PodGroup CRD is installed
// and served. The first time it is, it starts the controller's PodGroup
// watch (see package optional).
type Volcano struct {
	Client     client.Client // reads through the manager's cache
	Cache      cache.Cache
	Controller controller.Controller
	// Owner is the kind whose PodGroups are watched (a TrainingJob, a
	// RayCluster); events go to the owning object.
	Owner client.Object
	// Scheme of the owner.
	Scheme *runtime.Scheme

	once sync.Once
	kind *optional.Kind
}

// Installed reports whether PodGroups can be used now.
func (v *Volcano) Installed(ctx context.Context) (bool, error) {
	v.once.Do(func() {
		v.kind = &optional.Kind{CRD: CRDName, GVK: schedulingv1beta1.SchemeGroupVersion.WithKind("PodGroup"), Watch: func() error {
			return v.Controller.Watch(source.Kind(v.Cache, &schedulingv1beta1.PodGroup{},
				handler.TypedEnqueueRequestForOwner[*schedulingv1beta1.PodGroup](v.Scheme, v.Client.RESTMapper(), v.Owner, handler.OnlyControllerOwner())))
		}}
	})
	return v.kind.Served(ctx, v.Client)
}
