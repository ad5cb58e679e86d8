package gang

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/loom-dev/loom/internal/optional"
)

// QueueCRDName is Volcano's Queue CRD. It may be missing where the PodGroup
// CRD is installed (a partial install); then queues are not checked.
const QueueCRDName = "queues.scheduling.volcano.sh"

// DefaultQueue is the queue Volcano puts a PodGroup naming none in.
const DefaultQueue = "default"

// Reasons a gang's queue stops it.
const (
	// ReasonQueueNotFound: the queue the gang names does not exist.
	ReasonQueueNotFound = "QueueNotFound"
	// ReasonQueueClosed: the queue is Closed or Closing: Volcano admits
	// no new PodGroups to it.
	ReasonQueueClosed = "QueueClosed"
)

// QueueKind is Volcano's Queue (cluster-scoped).
var QueueKind = schema.GroupKind{Group: schedulingv1beta1.SchemeGroupVersion.Group, Kind: "Queue"}

// QueueProblem is why a gang's queue keeps Volcano from ever admitting it
// as things stand; the zero value is none.
type QueueProblem struct {
	Reason, Message string
}

// CheckQueue is the pure verdict on the queue called name: q is what the
// cache holds of it, nil when it does not exist. Open (or a state Volcano
// has not set yet) is no problem.
func CheckQueue(name string, q *schedulingv1beta1.Queue) QueueProblem {
	if name == "" {
		name = DefaultQueue
	}
	if q == nil {
		return QueueProblem{Reason: ReasonQueueNotFound, Message: fmt.Sprintf("Volcano queue %q does not exist: Volcano admits no gang to it until it is created (kubectl get queues.scheduling.volcano.sh)", name)}
	}
	switch q.Status.State {
	case schedulingv1beta1.QueueStateClosed, schedulingv1beta1.QueueStateClosing:
		return QueueProblem{Reason: ReasonQueueClosed, Message: fmt.Sprintf("Volcano queue %q is %s: it admits no new gangs until it is opened again", name, q.Status.State)}
	}
	return QueueProblem{}
}

// Queue checks the queue called name (empty: Volcano's default) from the
// cache: the zero QueueProblem when it is usable, or when Volcano's Queue
// CRD is not served (then queues are not checked). The first time Queues
// are served it starts the controller's Queue watch, which enqueues
// QueueUsers(queue) when a Queue is created, changed or deleted.
func (v *Volcano) Queue(ctx context.Context, name string) (QueueProblem, error) {
	v.queueOnce.Do(func() {
		v.queueKind = &optional.Kind{CRD: QueueCRDName, GVK: QueueKind.WithVersion(schedulingv1beta1.SchemeGroupVersion.Version), Watch: func() error {
			return v.Controller.Watch(source.Kind(v.Cache, &schedulingv1beta1.Queue{},
				handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, q *schedulingv1beta1.Queue) []reconcile.Request {
					if v.QueueUsers == nil {
						return nil
					}
					return v.QueueUsers(ctx, q.Name)
				})))
		}}
	})
	served, err := v.queueKind.Served(ctx, v.Client)
	if err != nil || !served {
		return QueueProblem{}, err
	}
	if name == "" {
		name = DefaultQueue
	}
	q := &schedulingv1beta1.Queue{}
	if err := v.Client.Get(ctx, client.ObjectKey{Name: name}, q); err != nil {
		if apierrors.IsNotFound(err) {
			return CheckQueue(name, nil), nil
		}
		return QueueProblem{}, err
	}
	return CheckQueue(name, q), nil
}
