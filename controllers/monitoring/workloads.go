package monitoring

import (
	"context"
	"errors"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
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
	// Client reads the cache.
	client.Client
	Labels map[string]string
	kind   workloadKind
	// writer writes the PodMonitors and the kind's Monitoring condition.
	writer *apply.Writer
	crds   operatorCRDs
	// proms reads the Prometheus objects (of every namespace).
	proms client.Reader
	// workload is set when the kind's own CRD may be missing.
	workload *optional.Kind
}

// workloadObserved is what the workload reconciler reads before deciding.
type workloadObserved struct {
	// obj is the workload; nil when there is nothing to do (gone, being
	// deleted, or its kind not served).
	obj client.Object
	// missing are the Prometheus Operator CRDs not installed; while the
	// PodMonitor's is, proms and nsLabels are not read.
	missing crdsMissing
	// proms are the Prometheus objects and PrometheusAgents
	// (AgentAsPrometheus), oldest first.
	proms []*monitoringv1.Prometheus
	// nsLabels are the labels of the workload's namespace.
	nsLabels map[string]string
}

// workloadDesired is the workload's PodMonitor (ensured, or removed when
// none is wanted) and its condition.
type workloadDesired struct {
	ensure, remove []client.Object
	cond           metav1.Condition
}

func (r *WorkloadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	o, err := r.observe(ctx, req)
	if err != nil || o.obj == nil {
		return observeResult(err)
	}
	d := r.desired(o)
	// A name conflict needs a person; another failed write is retried, and
	// both are in the condition first.
	conflict, err := writeChildren(ctx, r.writer, o.obj, d.ensure, d.remove)
	switch {
	case conflict != nil:
		d.cond = conflictCondition(r.kind.conditionType, conflict)
	case err != nil:
		d.cond = applyFailedCondition(r.kind.conditionType, err)
	}
	return ctrl.Result{}, errors.Join(err, writeCondition(ctx, r.writer, o.obj, r.kind.conditions(o.obj), d.cond))
}

func (r *WorkloadReconciler) observe(ctx context.Context, req ctrl.Request) (workloadObserved, error) {
	var o workloadObserved
	if r.workload != nil {
		served, err := r.workload.Served(ctx, r.Client)
		if err != nil || !served || req.Name == "" {
			return o, err // the kind's watch, once started, brings every object
		}
	}
	obj := r.kind.newObject()
	if err := r.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			// Its PodMonitor goes by garbage collection; the writer forgets
			// what it applied for it.
			r.writer.Forget(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: req.Name}})
		}
		return o, client.IgnoreNotFound(err)
	}
	if obj.GetDeletionTimestamp() != nil {
		return o, nil
	}
	var err error
	if o.missing, err = r.crds.missing(ctx, r.Client); err != nil {
		return o, err
	}
	if o.missing.has(KindPodMonitor) {
		if o.proms, err = prometheuses(ctx, r.proms, o.missing); err != nil {
			return o, err
		}
		o.nsLabels = namespaceLabels(ctx, r.Client, obj.GetNamespace())
	}
	o.obj = obj
	return o, nil
}

// desired computes the workload's PodMonitor and condition: none when the
// workload opted out or declares no metrics port, none yet while the
// Prometheus Operator is missing, else one carrying its selection labels.
func (r *WorkloadReconciler) desired(o workloadObserved) workloadDesired {
	ct := r.kind.conditionType
	key := client.ObjectKey{Namespace: o.obj.GetNamespace(), Name: r.kind.monitorName(o.obj.GetName())}
	base := r.kind.podMonitor(o.obj, nil)
	none := metav1.Condition{Type: ct, Status: metav1.ConditionFalse}
	switch {
	case OptedOut(o.obj):
		none.Reason, none.Message = ReasonOptedOut, "annotation "+AnnotationScrape+"=false: no PodMonitor"
	case base == nil:
		none.Reason, none.Message = ReasonNoMetricsPort, "no container declares a port named "+MetricsPortName+
			", so there is no PodMonitor; the pods' GPU metrics come from dcgm-exporter"
	case !o.missing.has(KindPodMonitor):
		return workloadDesired{cond: waitingForOperator(ct, o.missing.of(KindPodMonitor))}
	default:
		sel := Select(o.proms, Object{Kind: KindPodMonitor, Namespace: key.Namespace, Labels: base.Labels}, r.Labels,
			func(string) map[string]string { return o.nsLabels })
		return workloadDesired{
			ensure: []client.Object{r.kind.podMonitor(o.obj, sel.Labels)},
			cond:   selectionCondition(ct, o.missing.prometheusesReadable(), o.proms, []selected{{KindPodMonitor, key.String(), sel}}),
		}
	}
	d := workloadDesired{cond: none}
	if o.missing.has(KindPodMonitor) {
		d.remove = []client.Object{&monitoringv1.PodMonitor{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}
	}
	return d
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
