package monitoring

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/optional"
)

// GPUReconciler onboards the GPU fleet's monitoring for the ClusterPolicy in
// force: dcgm-exporter's Service, counters and ServiceMonitor, the GPU
// alert and recording rules, and the Grafana dashboards. Its condition
// Monitoring on the policy says which Prometheus selects them, or why none
// does.
type GPUReconciler struct {
	client.Client
	// APIReader reads around the cache (Services outside Loom's label).
	APIReader client.Reader
	// Namespace holds the operands and so these children.
	Namespace string
	// Labels are the configured selection labels (--monitoring-labels).
	Labels map[string]string
	// DashboardsNamespace is where the dashboards ConfigMap goes; empty
	// turns the dashboards off.
	DashboardsNamespace string

	crds operatorCRDs
}

var clusterPolicyGVK = gpuv1alpha1.GroupVersion.WithKind("ClusterPolicy")

// Reconcile works on the policy in force whatever the request names: there
// is one, and its children go with it by garbage collection.
func (r *GPUReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	policies := &gpuv1alpha1.ClusterPolicyList{}
	if err := r.List(ctx, policies); err != nil {
		return ctrl.Result{}, err
	}
	cp := gpuv1alpha1.Active(policies.Items)
	if cp == nil {
		return ctrl.Result{}, nil
	}
	owner := *metav1.NewControllerRef(cp, clusterPolicyGVK)
	exporter := cp.Spec.OperandEnabled(gpuv1alpha1.OperandDCGMExporter)
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: r.Namespace, Name: name} }

	var errs []error
	var svc, counters, dashboards client.Object
	if exporter {
		svc = ExporterService(r.Namespace)
		if cp.Spec.DCGMExporter.MetricsConfigMapName == "" {
			counters = CountersConfig(r.Namespace)
		}
	}
	if r.DashboardsNamespace != "" {
		dashboards = Dashboards(r.DashboardsNamespace)
	}
	if svc != nil && r.APIReader != nil {
		// The cache holds only Loom's Services: before creating, make sure
		// the name is not someone else's.
		if err := r.Get(ctx, key(ExporterName), &corev1.Service{}); apierrors.IsNotFound(err) {
			if err := r.APIReader.Get(ctx, key(ExporterName), &corev1.Service{}); err == nil {
				errs = append(errs, errConflict{kind: "Service", key: key(ExporterName).String()})
				svc = nil
			}
		}
	}
	errs = append(errs,
		ensure(ctx, r.Client, &corev1.Service{}, key(ExporterName), svc, owner),
		ensure(ctx, r.Client, &corev1.ConfigMap{}, key(CountersConfigMap), counters, owner))
	if r.DashboardsNamespace != "" {
		errs = append(errs, ensure(ctx, r.Client, &corev1.ConfigMap{}, client.ObjectKey{Namespace: r.DashboardsNamespace, Name: DashboardsConfigMap}, dashboards, owner))
	}
	errs = append(errs, r.removeStaleDashboards(ctx))

	missing, err := r.crds.missing(ctx, r.Client)
	if errors.Is(err, optional.ErrNotServedYet) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	var cond metav1.Condition
	if len(missing) > 0 {
		cond = waitingForOperator(missing)
	} else {
		proms, err := prometheuses(ctx, r.Client)
		if err != nil {
			return ctrl.Result{}, err
		}
		nsLabels := namespaceLabels(ctx, r.Client)
		smSel := Select(proms, Object{Kind: KindServiceMonitor, Namespace: r.Namespace, Labels: ownedLabels(gpuv1alpha1.OperandDCGMExporter)}, r.Labels, nsLabels)
		ruleSel := Select(proms, Object{Kind: KindPrometheusRule, Namespace: r.Namespace, Labels: ownedLabels("alerts")}, r.Labels, nsLabels)
		var sm client.Object
		if exporter {
			sm = ExporterServiceMonitor(r.Namespace, smSel.Labels)
		}
		errs = append(errs,
			ensure(ctx, r.Client, &monitoringv1.ServiceMonitor{}, key(ExporterName), sm, owner),
			ensure(ctx, r.Client, &monitoringv1.PrometheusRule{}, key(RuleName), GPURule(r.Namespace, ruleSel.Labels), owner))
		parts := []selected{{KindPrometheusRule, r.Namespace + "/" + RuleName, ruleSel}}
		if exporter {
			parts = append([]selected{{KindServiceMonitor, r.Namespace + "/" + ExporterName, smSel}}, parts...)
		}
		cond = selectionCondition(len(proms), parts)
		if !exporter && cond.Status == metav1.ConditionTrue {
			cond.Status, cond.Reason = metav1.ConditionFalse, ReasonExporterDisabled
			cond.Message = "dcgm-exporter is disabled in the policy, so there are no GPU metrics; " + cond.Message
		}
	}
	// A name conflict needs a person and goes into the condition; other
	// errors are retried after the condition is written.
	var retry []error
	for _, err := range errs {
		var c errConflict
		if errors.As(err, &c) {
			cond = metav1.Condition{Type: cond.Type, Status: metav1.ConditionFalse, Reason: ReasonConflict, Message: c.Error()}
		} else if err != nil {
			retry = append(retry, err)
		}
	}
	if err := setCondition(ctx, r.Client, cp, clusterPolicyGVK, cp.Status.Conditions, cond); err != nil {
		retry = append(retry, err)
	}
	return ctrl.Result{}, errors.Join(retry...)
}

// removeStaleDashboards deletes Loom's dashboards ConfigMaps outside the
// configured namespace (dashboards turned off, or moved).
func (r *GPUReconciler) removeStaleDashboards(ctx context.Context) error {
	list := &corev1.ConfigMapList{}
	if err := r.List(ctx, list, client.MatchingLabels(ownedLabels("dashboards"))); err != nil {
		return err
	}
	var errs []error
	for i := range list.Items {
		cm := &list.Items[i]
		if cm.Name == DashboardsConfigMap && cm.Namespace != r.DashboardsNamespace && cm.DeletionTimestamp == nil {
			errs = append(errs, client.IgnoreNotFound(r.Delete(ctx, cm)))
		}
	}
	return errors.Join(errs...)
}

// selected is one object and its selection, for the condition message.
type selected struct {
	kind, key string
	sel       Selection
}

func waitingForOperator(missing []string) metav1.Condition {
	return metav1.Condition{Type: ConditionMonitoring, Status: metav1.ConditionFalse, Reason: ReasonOperatorMissing,
		Message: fmt.Sprintf("waiting for the Prometheus Operator: CRD %s not installed; monitors and rules are created as soon as it is",
			strings.Join(missing, ", "))}
}

// selectionCondition is True when a Prometheus selects every object, and
// otherwise names, per Prometheus, the label or namespace that is missing.
func selectionCondition(prometheuses int, parts []selected) metav1.Condition {
	cond := metav1.Condition{Type: ConditionMonitoring}
	if prometheuses == 0 {
		var keys []string
		for _, p := range parts {
			keys = append(keys, p.kind+" "+p.key)
		}
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNoPrometheus
		cond.Message = strings.Join(keys, ", ") + " written, but there is no Prometheus object in the cluster to select them"
		return cond
	}
	var ok, notOK []string
	for _, p := range parts {
		if len(p.sel.SelectedBy) == 0 {
			notOK = append(notOK, fmt.Sprintf("no Prometheus selects %s %s (%s)", p.kind, p.key, joinCapped(p.sel.Why, "; ")))
			continue
		}
		s := fmt.Sprintf("%s %s selected by Prometheus %s", p.kind, p.key, strings.Join(p.sel.SelectedBy, ", "))
		if p.sel.Learned != "" {
			s += fmt.Sprintf(" (labels %s learned from %s)", formatLabels(p.sel.Labels), p.sel.Learned)
		}
		if len(p.sel.Why) > 0 {
			s += " but not by " + joinCapped(p.sel.Why, ", nor ")
		}
		ok = append(ok, s)
	}
	if len(notOK) > 0 {
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNotSelected
		cond.Message = strings.Join(append(notOK, ok...), "; ")
		return cond
	}
	cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, ReasonSelected, strings.Join(ok, "; ")
	return cond
}

// conflictOr turns a name conflict into the condition (it needs a person);
// other errors are retried.
func conflictOr(err error, cond metav1.Condition) metav1.Condition {
	var c errConflict
	if errors.As(err, &c) {
		return metav1.Condition{Type: cond.Type, Status: metav1.ConditionFalse, Reason: ReasonConflict, Message: c.Error()}
	}
	return cond
}

func prometheuses(ctx context.Context, c client.Reader) ([]*monitoringv1.Prometheus, error) {
	list := &monitoringv1.PrometheusList{}
	if err := c.List(ctx, list); err != nil {
		return nil, err
	}
	out := make([]*monitoringv1.Prometheus, 0, len(list.Items))
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			out = append(out, &list.Items[i])
		}
	}
	SortPrometheuses(out)
	return out, nil
}

// namespaceLabels reads namespace labels from the metadata cache.
func namespaceLabels(ctx context.Context, c client.Reader) func(string) map[string]string {
	return func(name string) map[string]string {
		ns := &metav1.PartialObjectMetadata{}
		ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
		if err := c.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
			return map[string]string{corev1.LabelMetadataName: name}
		}
		return ns.Labels
	}
}

// maxReasons caps the per-Prometheus reasons in a message, so that a
// cluster with many Prometheus objects keeps conditions short.
const maxReasons = 3

func joinCapped(items []string, sep string) string {
	if len(items) <= maxReasons {
		return strings.Join(items, sep)
	}
	return strings.Join(items[:maxReasons], sep) + fmt.Sprintf("%sand %d more", sep, len(items)-maxReasons)
}

func formatLabels(l map[string]string) string {
	var parts []string
	for _, k := range sortedKeys(l) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}
