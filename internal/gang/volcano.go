package gang

import (
	"context"
	"regexp"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/loom-dev/loom/internal/optional"
)

// PodGroupKind is Volcano's PodGroup. Its CRD has no status subresource, so
// its generation moves with Volcano's status updates: writers compare its spec
// alone (apply.Options.SpecOnly).
var PodGroupKind = schema.GroupKind{Group: schedulingv1beta1.SchemeGroupVersion.Group, Kind: "PodGroup"}

// ErrNotServedYet: the PodGroup CRD exists but the API server does not serve
// the kind yet (a CRD just created); retry in a moment.
var ErrNotServedYet = optional.ErrNotServedYet

// IsCRD selects the PodGroup and Queue CRDs in a (metadata-only) CRD watch,
// through which a controller learns that Volcano was installed.
var IsCRD = optional.IsCRD(CRDName, QueueCRDName)

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
	// QueueUsers lists the objects that name a Volcano queue and wait on
	// it: a change of that Queue enqueues them (see Queue).
	QueueUsers func(ctx context.Context, queue string) []reconcile.Request

	once      sync.Once
	kind      *optional.Kind
	queueOnce sync.Once
	queueKind *optional.Kind
}

// Installed reports whether PodGroups can be used now.
func (v *Volcano) Installed(ctx context.Context) (bool, error) {
	v.once.Do(func() {
		v.kind = &optional.Kind{CRD: CRDName, GVK: PodGroupKind.WithVersion(schedulingv1beta1.SchemeGroupVersion.Version), Watch: func() error {
			return v.Controller.Watch(source.Kind(v.Cache, &schedulingv1beta1.PodGroup{},
				handler.TypedEnqueueRequestForOwner[*schedulingv1beta1.PodGroup](v.Scheme, v.Client.RESTMapper(), v.Owner, handler.OnlyControllerOwner())))
		}}
	})
	return v.kind.Served(ctx, v.Client)
}

// Group returns owner's PodGroup called name from the cache, when Volcano
// is installed and owner controls it: installed says whether PodGroups can
// be used at all; pg is nil when owner has none of that name.
func (v *Volcano) Group(ctx context.Context, owner client.Object, name string) (pg *schedulingv1beta1.PodGroup, installed bool, err error) {
	if installed, err = v.Installed(ctx); err != nil || !installed {
		return nil, installed, err
	}
	pg = &schedulingv1beta1.PodGroup{}
	if err := v.Client.Get(ctx, client.ObjectKey{Namespace: owner.GetNamespace(), Name: name}, pg); err != nil {
		return nil, true, client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(pg, owner) {
		return nil, true, nil
	}
	return pg, true, nil
}

// Unschedulable is Volcano's own word on why it cannot place pg's gang
// ("NotEnoughResources: 4/4 tasks in gang unschedulable: …"), while that
// still applies: its Unschedulable condition is True and no Scheduled
// condition came after it (Volcano keeps one condition of each type, so a
// gang placed since keeps the old Unschedulable one). reason is the
// condition's reason when it is a valid condition reason, else
// "Unschedulable"; both are "" when nothing applies.
func Unschedulable(pg *schedulingv1beta1.PodGroup) (reason, why string) {
	if pg == nil {
		return "", ""
	}
	var unsched, sched *schedulingv1beta1.PodGroupCondition
	for i := range pg.Status.Conditions {
		c := &pg.Status.Conditions[i]
		switch {
		case c.Type == schedulingv1beta1.PodGroupUnschedulableType && c.Status == corev1.ConditionTrue:
			unsched = c
		case c.Type == schedulingv1beta1.PodGroupScheduled && c.Status == corev1.ConditionTrue:
			sched = c
		}
	}
	if unsched == nil || (sched != nil && !sched.LastTransitionTime.Before(&unsched.LastTransitionTime)) {
		return "", ""
	}
	reason = unsched.Reason
	if len(reason) > 1024 || !conditionReason.MatchString(reason) {
		reason = string(schedulingv1beta1.PodGroupUnschedulableType)
	}
	return reason, strings.TrimSuffix(strings.TrimSpace(unsched.Reason+": "+unsched.Message), ":")
}

// conditionReason is what metav1.Condition accepts as a reason.
var conditionReason = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)
