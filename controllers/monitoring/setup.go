// Package monitoring onboards GPU and workload monitoring into the
// Prometheus Operator: dcgm-exporter's Service, counters and ServiceMonitor,
// the node agent's PodMonitor, Loom's GPU alert and recording rules, Grafana
// dashboards, and a PodMonitor per TrainingJob and RayCluster. Each object carries the labels a
// Prometheus needs to select it (configured, or learned from the Prometheus
// objects' selectors), and a Monitoring condition on the onboarded object
// says which Prometheus selects it, or which label or namespace is missing.
// Without the Prometheus Operator's CRDs the condition says so, and
// onboarding starts when they are installed, without a restart.
//
// Each reconciler observes the cache, computes its children and its
// condition as pure functions of what it saw, and writes both through one
// apply.Writer (field owner loom-monitoring): children only when they
// differ from what it last applied, and only the condition type it owns. A
// child's name taken by an object Loom does not control is left alone and
// reported as NameConflict.
package monitoring

import (
	"context"
	"maps"
	"slices"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	monitoringv1alpha1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/optional"
)

// +kubebuilder:rbac:groups=monitoring.coreos.com,resources=servicemonitors;podmonitors;prometheusrules,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=monitoring.coreos.com,resources=prometheuses;prometheusagents,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services;configmaps,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=services/finalizers,verbs=update
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies/status,verbs=get;patch
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=clusterpolicies/finalizers,verbs=update
// +kubebuilder:rbac:groups=training.loom.dev,resources=trainingjobs/finalizers,verbs=update
// +kubebuilder:rbac:groups=ray.io,resources=rayclusters/finalizers,verbs=update
// +kubebuilder:rbac:groups=training.loom.dev,resources=trainingjobs/status,verbs=get;patch
// +kubebuilder:rbac:groups=ray.io,resources=rayclusters/status,verbs=get;patch

// Setup registers the GPU, TrainingJob and RayCluster monitoring
// reconcilers.
func Setup(ctx context.Context, mgr ctrl.Manager, opts manager.Options) error {
	promCache, err := prometheusCache(mgr, opts)
	if err != nil {
		return err
	}
	gr := newGPUReconciler(mgr.GetClient(), mgr.GetAPIReader(), promCache, opts)
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []ctrl.Request {
		return []ctrl.Request{{NamespacedName: client.ObjectKey{Name: "gpu"}}}
	})
	gc, err := ctrl.NewControllerManagedBy(mgr).
		Named("gpu-monitoring").
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Watches(&gpuv1alpha1.ClusterPolicy{}, one, builder.WithPredicates(specOrCondition(policyConditions, ConditionMonitoring))).
		Watches(&corev1.Service{}, one, builder.WithPredicates(loomComponent)).
		Watches(&corev1.ConfigMap{}, one, builder.WithPredicates(predicate.Or(loomComponent,
			named(opts.Namespace, CountersConfigMap), named(gr.DashboardsNamespace, DashboardsConfigMap)))).
		WatchesMetadata(&apiextensionsv1.CustomResourceDefinition{}, one, builder.WithPredicates(isOperatorCRD)).
		WatchesMetadata(&corev1.Namespace{}, one, builder.WithPredicates(predicate.LabelChangedPredicate{},
			predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == opts.Namespace }))).
		Build(gr)
	if err != nil {
		return err
	}
	watch := func(c controller.Controller, obj client.Object, h handler.EventHandler, p ...predicate.Predicate) func() error {
		return func() error { return c.Watch(source.Kind(mgr.GetCache(), obj, h, p...)) }
	}
	// Each kind on its own: a cluster may have only some of these CRDs
	// (Grafana Alloy or VictoriaMetrics' converter: monitors, no
	// Prometheus).
	gr.crds = append(operatorCRDs{
		crdKind("servicemonitors", monitoringv1.SchemeGroupVersion.WithKind(monitoringv1.ServiceMonitorsKind), watch(gc, &monitoringv1.ServiceMonitor{}, one,
			predicate.Or(loomComponent, named(opts.Namespace, ExporterName), named(opts.Namespace, ManagerServiceMonitorName)))),
		crdKind("prometheusrules", monitoringv1.SchemeGroupVersion.WithKind(monitoringv1.PrometheusRuleKind), watch(gc, &monitoringv1.PrometheusRule{}, one,
			predicate.Or(loomComponent, named(opts.Namespace, RuleName)))),
		crdKind("podmonitors", monitoringv1.SchemeGroupVersion.WithKind(monitoringv1.PodMonitorsKind), watch(gc, &monitoringv1.PodMonitor{}, one,
			predicate.Or(nodeAgentMonitor, named(opts.Namespace, NodeAgentPodMonitorName)))),
	}, prometheusKinds(gc, promCache, one)...)
	registerInventoryMetrics(mgr.GetCache(), opts.Namespace)
	if err := setupWorkloads(mgr, opts, trainingJobs, watch, promCache); err != nil {
		return err
	}
	return setupWorkloads(mgr, opts, rayClusters, watch, promCache)
}

// newGPUReconciler is the GPU reconciler writing through c, reading around
// the cache through live and the Prometheus objects through proms, without
// the watches Setup adds (crds).
func newGPUReconciler(c client.Client, live, proms client.Reader, opts manager.Options) *GPUReconciler {
	gr := &GPUReconciler{Client: c, Namespace: opts.Namespace, Labels: opts.MonitoringLabels, proms: proms, live: live,
		Manager: ManagerScrape{Service: opts.MetricsServiceMonitor, Interval: opts.MetricsScrapeInterval, Secure: opts.MetricsSecure},
		// The cache holds only Loom's Services: before creating one, the
		// writer makes sure the name is not someone else's.
		writer: apply.NewWriter(c, FieldOwner, apply.Options{Live: live, Conditions: []string{ConditionMonitoring}})}
	gr.ManagerLabels = opts.MonitoringLabels
	if len(opts.MetricsServiceMonitorLabels) > 0 {
		gr.ManagerLabels = maps.Clone(opts.MetricsServiceMonitorLabels)
		for k, v := range opts.MonitoringLabels {
			if _, ok := gr.ManagerLabels[k]; !ok {
				gr.ManagerLabels[k] = v
			}
		}
	}
	if opts.GrafanaDashboards {
		gr.DashboardsNamespace = opts.DashboardsNamespace
		if gr.DashboardsNamespace == "" {
			gr.DashboardsNamespace = opts.Namespace
		}
	}
	return gr
}

// newWorkloadReconciler is the kind's workload reconciler writing through
// c, without the watches setupWorkloads adds (crds, workload).
func newWorkloadReconciler(c client.Client, proms client.Reader, opts manager.Options, kind workloadKind) *WorkloadReconciler {
	return &WorkloadReconciler{Client: c, Labels: opts.MonitoringLabels, kind: kind, proms: proms,
		writer: apply.NewWriter(c, FieldOwner, apply.Options{Conditions: []string{kind.conditionType}})}
}

// prometheusCache is where the reconcilers read Prometheus objects: the
// manager's cache, or, when --watch-namespaces restricts that one to some
// namespaces, a cache of their own over every namespace. A Prometheus
// usually lives in a namespace of its own, and it decides what selects
// Loom's monitors wherever they are.
func prometheusCache(mgr ctrl.Manager, opts manager.Options) (cache.Cache, error) {
	if len(opts.WatchNamespaces) == 0 {
		return mgr.GetCache(), nil
	}
	// Its informer starts when the kind is first read or watched, once
	// the Prometheus Operator's CRD is served.
	c, err := cache.New(mgr.GetConfig(), cache.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, err
	}
	return c, mgr.Add(startedWithCaches{c})
}

// startedWithCaches makes the manager start a cache with its own, before
// any controller, and wait for it to sync.
type startedWithCaches struct{ cache.Cache }

func (c startedWithCaches) GetCache() cache.Cache { return c.Cache }

// prometheusKinds are the kinds whose objects select Loom's monitors, each
// read once its CRD is served: Prometheus and PrometheusAgent.
func prometheusKinds(c controller.Controller, promCache cache.Cache, h handler.EventHandler) operatorCRDs {
	watch := func(obj client.Object) func() error {
		return func() error { return c.Watch(source.Kind(promCache, obj, h, selectorsChanged)) }
	}
	return operatorCRDs{
		crdKind("prometheuses", monitoringv1.SchemeGroupVersion.WithKind(monitoringv1.PrometheusesKind), watch(&monitoringv1.Prometheus{})),
		crdKind("prometheusagents", monitoringv1alpha1.SchemeGroupVersion.WithKind(monitoringv1alpha1.PrometheusAgentsKind), watch(&monitoringv1alpha1.PrometheusAgent{})),
	}
}

func setupWorkloads(mgr ctrl.Manager, opts manager.Options, kind workloadKind,
	watch func(controller.Controller, client.Object, handler.EventHandler, ...predicate.Predicate) func() error, promCache cache.Cache) error {
	r := newWorkloadReconciler(mgr.GetClient(), promCache, opts, kind)
	all := handler.EnqueueRequestsFromMapFunc(r.all)
	var crds predicate.Predicate = isOperatorCRD
	if kind.crd != "" {
		crds = predicate.Or(isOperatorCRD, optional.IsCRD(kind.crd))
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(kind.name).
		WatchesMetadata(&apiextensionsv1.CustomResourceDefinition{}, all, builder.WithPredicates(crds)).
		WatchesMetadata(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.inNamespace), builder.WithPredicates(predicate.LabelChangedPredicate{}, noCreate))
	changes := specOrCondition(kind.conditions, kind.conditionType)
	if kind.crd == "" {
		b = b.For(kind.newObject(), builder.WithPredicates(changes))
	}
	c, err := b.Build(r)
	if err != nil {
		return err
	}
	if kind.crd != "" {
		// A kind another component may install (KubeRay's CRD, by Loom's
		// raycluster controller or KubeRay): watched once served.
		r.workload = &optional.Kind{CRD: kind.crd, GVK: kind.gvk,
			Watch: watch(c, kind.newObject(), &handler.EnqueueRequestForObject{}, changes)}
	}
	// A PodMonitor goes to the workload its name is for: Loom's, and a
	// user's that holds the name (its deletion frees the name for Loom's).
	prefix := kind.monitorName("")
	byName := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []ctrl.Request {
		name, ok := strings.CutPrefix(o.GetName(), prefix)
		if !ok || name == "" {
			return nil
		}
		return []ctrl.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
	})
	r.crds = append(operatorCRDs{
		crdKind("podmonitors", monitoringv1.SchemeGroupVersion.WithKind(monitoringv1.PodMonitorsKind), watch(c, &monitoringv1.PodMonitor{}, byName)),
	}, prometheusKinds(c, promCache, all)...)
	return nil
}

// operatorCRDNames are the Prometheus Operator CRDs Loom uses.
var operatorCRDNames = []string{"servicemonitors", "podmonitors", "prometheusrules", "prometheuses", "prometheusagents"}

var isOperatorCRD = predicate.NewPredicateFuncs(func(o client.Object) bool {
	plural, group, _ := strings.Cut(o.GetName(), ".")
	return group == monitoringv1.SchemeGroupVersion.Group && slices.Contains(operatorCRDNames, plural)
})

// loomComponent selects the monitoring children (Loom's, by label).
var loomComponent = predicate.NewPredicateFuncs(func(o client.Object) bool {
	return o.GetLabels()[apply.LabelManagedBy] == apply.ManagedBy && o.GetLabels()[gpuv1alpha1.LabelComponent] != ""
})

// nodeAgentMonitor selects the node agent's PodMonitor (the workload
// PodMonitors are the workload reconcilers').
var nodeAgentMonitor = predicate.NewPredicateFuncs(func(o client.Object) bool {
	return o.GetLabels()[apply.LabelManagedBy] == apply.ManagedBy && o.GetLabels()[gpuv1alpha1.LabelComponent] == componentNodeAgent
})

// named passes the objects of a child's name, Loom's or not: a user's
// object that holds the name (a NameConflict) frees it when deleted, and
// Loom's child then follows at once.
func named(namespace, name string) predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return namespace != "" && o.GetNamespace() == namespace && o.GetName() == name
	})
}

var noCreate = predicate.Funcs{CreateFunc: func(event.CreateEvent) bool { return false }}

// selectorsChanged passes Prometheus objects whose spec (selectors)
// changed, not their frequent status updates.
var selectorsChanged = predicate.GenerationChangedPredicate{}

// specOrCondition passes spec and annotation changes of an onboarded
// object, and changes of the monitoring condition (another writer may have
// dropped it), but not the owner's own status updates.
func specOrCondition(conditions func(client.Object) []metav1.Condition, conditionType string) predicate.Predicate {
	return predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{},
		predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			return !apiequality.Semantic.DeepEqual(meta.FindStatusCondition(conditions(e.ObjectOld), conditionType),
				meta.FindStatusCondition(conditions(e.ObjectNew), conditionType))
		}})
}

func policyConditions(o client.Object) []metav1.Condition {
	return o.(*gpuv1alpha1.ClusterPolicy).Status.Conditions
}
