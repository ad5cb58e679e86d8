package monitoring

import (
	"context"
	"errors"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/optional"
)

// workloadKind is what the workload reconciler needs to know of one kind of
// workload (TrainingJob, RayCluster).
type workloadKind struct {
	name string
	// crd names the kind's CRD when it may be missing at start (then the
	// kind is watched once served).
	crd           string
	gvk           schema.GroupVersionKind
	conditionType string
	newObject     func() client.Object
	newList       func() client.ObjectList
	conditions    func(client.Object) []metav1.Condition
	monitorName   func(name string) string
	// podMonitor is the desired PodMonitor, nil when there is nothing to
	// scrape.
	podMonitor func(o client.Object, selection map[string]string) *monitoringv1.PodMonitor
}

var trainingJobs = workloadKind{
	name: "trainingjob-monitoring", gvk: trainingv1alpha1.GroupVersion.WithKind("TrainingJob"), conditionType: ConditionMonitoring,
	newObject:   func() client.Object { return &trainingv1alpha1.TrainingJob{} },
	newList:     func() client.ObjectList { return &trainingv1alpha1.TrainingJobList{} },
	conditions:  func(o client.Object) []metav1.Condition { return o.(*trainingv1alpha1.TrainingJob).Status.Conditions },
	monitorName: TrainingJobPodMonitorName,
	podMonitor: func(o client.Object, sel map[string]string) *monitoringv1.PodMonitor {
		return TrainingJobPodMonitor(o.(*trainingv1alpha1.TrainingJob), sel)
	},
}

var rayClusters = workloadKind{
	name: "raycluster-monitoring", crd: "rayclusters.ray.io", gvk: rayv1.SchemeGroupVersion.WithKind("RayCluster"), conditionType: RayConditionMonitoring,
	newObject:   func() client.Object { return &rayv1.RayCluster{} },
	newList:     func() client.ObjectList { return &rayv1.RayClusterList{} },
	conditions:  func(o client.Object) []metav1.Condition { return o.(*rayv1.RayCluster).Status.Conditions },
	monitorName: RayClusterPodMonitorName,
	podMonitor: func(o client.Object, sel map[string]string) *monitoringv1.PodMonitor {
		return RayClusterPodMonitor(o.(*rayv1.RayCluster), sel)
	},
}

// WorkloadReconciler gives each workload of one kind its PodMonitor and its
// Monitoring condition.
type WorkloadReconciler struct {
	client.Client
	Labels map[string]string
	kind   workloadKind
	crds   operatorCRDs
	// workload is set when the kind's own CRD may be missing.
	workload *optional.Kind
}

func (r *WorkloadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if r.workload != nil {
		served, err := r.workload.Served(ctx, r.Client)
		if errors.Is(err, optional.ErrNotServedYet) {
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		if err != nil || !served || req.Name == "" {
			return ctrl.Result{}, err // the kind's watch, once started, brings every object
		}
	}
	obj := r.kind.newObject()
	if err := r.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err) // the PodMonitor goes by garbage collection
	}
	if obj.GetDeletionTimestamp() != nil {
		return ctrl.Result{}, nil
	}
	want := r.kind.podMonitor(obj, nil)
	cond := metav1.Condition{Type: r.kind.conditionType, Status: metav1.ConditionFalse}
	switch {
	case OptedOut(obj):
		want = nil
		cond.Reason, cond.Message = ReasonOptedOut, "annotation "+AnnotationScrape+"=false: no PodMonitor"
	case want == nil:
		cond.Reason, cond.Message = ReasonNoMetricsPort, "no container declares a port named "+MetricsPortName+
			", so there is no PodMonitor; the pods' GPU metrics come from dcgm-exporter"
	}

	missing, err := r.crds.missing(ctx, r.Client)
	if errors.Is(err, optional.ErrNotServedYet) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	key := client.ObjectKey{Namespace: obj.GetNamespace(), Name: r.kind.monitorName(obj.GetName())}
	switch {
	case len(missing) > 0 && want != nil:
		cond = waitingForOperator(missing)
		cond.Type = r.kind.conditionType
	case len(missing) > 0:
	case want == nil:
		if err := ensure(ctx, r.Client, &monitoringv1.PodMonitor{}, key, nil, metav1.OwnerReference{}); err != nil {
			return ctrl.Result{}, err
		}
	default:
		proms, err := prometheuses(ctx, r.Client)
		if err != nil {
			return ctrl.Result{}, err
		}
		sel := Select(proms, Object{Kind: KindPodMonitor, Namespace: obj.GetNamespace(), Labels: want.Labels}, r.Labels, namespaceLabels(ctx, r.Client))
		owner := *metav1.NewControllerRef(obj, r.kind.gvk)
		cond = selectionCondition(len(proms), []selected{{KindPodMonitor, key.String(), sel}})
		cond.Type = r.kind.conditionType
		if err := ensure(ctx, r.Client, &monitoringv1.PodMonitor{}, key, r.kind.podMonitor(obj, sel.Labels), owner); err != nil {
			if cond = conflictOr(err, cond); cond.Reason != ReasonConflict {
				return ctrl.Result{}, err
			}
		}
	}
	return ctrl.Result{}, setCondition(ctx, r.Client, obj, r.kind.gvk, r.kind.conditions(obj), cond)
}

// all lists every workload of the kind (a Prometheus or a CRD changed).
func (r *WorkloadReconciler) all(ctx context.Context, _ client.Object) []ctrl.Request {
	return r.list(ctx)
}

// inNamespace lists the workloads of a namespace whose labels changed (a
// Prometheus's namespace selector may now admit or refuse them).
func (r *WorkloadReconciler) inNamespace(ctx context.Context, ns client.Object) []ctrl.Request {
	return r.list(ctx, client.InNamespace(ns.GetName()))
}

func (r *WorkloadReconciler) list(ctx context.Context, opts ...client.ListOption) []ctrl.Request {
	if r.workload != nil && !r.workload.Watching() {
		return []ctrl.Request{{}} // Reconcile starts the kind's watch when served
	}
	list := r.kind.newList()
	if err := r.List(ctx, list, opts...); err != nil {
		return nil
	}
	var reqs []ctrl.Request
	_ = meta.EachListItem(list, func(o runtime.Object) error {
		reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(o.(client.Object))})
		return nil
	})
	return reqs
}
