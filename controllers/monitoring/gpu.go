package monitoring

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	monitoringv1alpha1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
)

// GPUReconciler onboards the GPU fleet's monitoring for the ClusterPolicy in
// force: dcgm-exporter's Service, counters and ServiceMonitor, the node
// agent's PodMonitor, the GPU alert and recording rules, and the Grafana
// dashboards; and the manager's own ServiceMonitor, policy or not
// (manager_monitor.go). Its condition
// Monitoring on the policy says which Prometheus selects them, or why none
// does.
type GPUReconciler struct {
	// Client reads the cache.
	client.Client
	// Namespace holds the operands and so these children.
	Namespace string
	// Labels are the configured selection labels (--monitoring-labels).
	Labels map[string]string
	// DashboardsNamespace is where the dashboards ConfigMap goes; empty
	// turns the dashboards off.
	DashboardsNamespace string
	// Manager is how the manager's own metrics are scraped; its Service
	// empty: no ServiceMonitor for them. ManagerLabels are that
	// ServiceMonitor's configured labels (beside Labels).
	Manager       ManagerScrape
	ManagerLabels map[string]string

	// writer writes the children and the Monitoring condition; it reads
	// around the cache before creating a Service (the cache holds only
	// Loom's).
	writer *apply.Writer
	crds   operatorCRDs
	// proms reads the Prometheus objects (of every namespace).
	proms client.Reader
	// live reads around the cache: the manager's metrics Service.
	live client.Reader
}

// gpuObserved is what the GPU reconciler reads before deciding.
type gpuObserved struct {
	policy *gpuv1alpha1.ClusterPolicy
	// dashboards are Loom's dashboards ConfigMaps, wherever they are.
	dashboards []corev1.ConfigMap
	// missing are the Prometheus Operator CRDs not installed: the objects
	// of those kinds are neither written nor read.
	missing crdsMissing
	// proms are the Prometheus objects and PrometheusAgents
	// (AgentAsPrometheus), oldest first.
	proms []*monitoringv1.Prometheus
	// nsLabels are the labels of the operands' namespace.
	nsLabels map[string]string
	// metricsService is the manager's metrics Service, read when its
	// ServiceMonitor is wanted; nil when it does not exist.
	metricsService *metav1.PartialObjectMetadata
}

// gpuDesired is what the GPU reconciler wants: the children to ensure, the
// children to remove (named by kind and key), and the objects its condition
// reports on, with their selection.
type gpuDesired struct {
	ensure, remove []client.Object
	parts          []selected
	// notes go first in the condition's message.
	notes []string
}

// Reconcile works on the policy in force whatever the request names: there
// is one, and its children go with it by garbage collection.
func (r *GPUReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	o, err := r.observe(ctx)
	if err != nil {
		return observeResult(err)
	}
	var res ctrl.Result
	if r.Manager.Service != "" && o.missing.has(KindServiceMonitor) && o.metricsService == nil {
		// The manager's metrics Service is not watched: asked again.
		res.RequeueAfter = conflictRecheck
	}
	// The manager's ServiceMonitor goes with its Service, policy or not.
	mgrConflict, mgrErr := r.writeManagerMonitor(ctx, o)
	if o.policy == nil {
		return res, mgrErr
	}
	d := r.desired(o)
	// A name conflict needs a person and goes into the condition; other
	// errors are retried after the condition is written.
	conflict, err := writeChildren(ctx, r.writer, o.policy, d.ensure, d.remove)
	if conflict == nil {
		conflict = mgrConflict
	}
	err = errors.Join(err, mgrErr)
	cond := gpuCondition(o, d, conflict)
	if err != nil && conflict == nil {
		cond = applyFailedCondition(ConditionMonitoring, err)
	}
	if conflict != nil {
		// The cache holds only Loom's Services: a user's that holds the
		// name is not watched, and its deletion is seen by asking again.
		res.RequeueAfter = conflictRecheck
	}
	return res, errors.Join(err, writeCondition(ctx, r.writer, o.policy, o.policy.Status.Conditions, cond))
}

func (r *GPUReconciler) observe(ctx context.Context) (gpuObserved, error) {
	var o gpuObserved
	policies := &gpuv1alpha1.ClusterPolicyList{}
	if err := r.List(ctx, policies); err != nil {
		return o, err
	}
	var err error
	// Before anything else: a nil crdsMissing would say every CRD is
	// installed (the manager's ServiceMonitor removed through a cache that
	// cannot serve its kind).
	if o.missing, err = r.crds.missing(ctx, r.Client); err != nil {
		return o, err
	}
	if o.policy = gpuv1alpha1.Active(policies.Items); o.policy == nil && r.Manager.Service == "" {
		return o, nil
	}
	if o.policy != nil {
		dashboards := &corev1.ConfigMapList{}
		if err := r.List(ctx, dashboards, client.MatchingLabels(ownedLabels(componentDashboards))); err != nil {
			return o, err
		}
		o.dashboards = dashboards.Items
	}
	if o.proms, err = prometheuses(ctx, r.proms, o.missing); err != nil {
		return o, err
	}
	o.nsLabels = namespaceLabels(ctx, r.Client, r.Namespace)
	if r.Manager.Service != "" && o.missing.has(KindServiceMonitor) {
		o.metricsService, err = r.managerService(ctx)
	}
	return o, err
}

// desired computes the children from what was observed. The Service,
// counters and dashboards need no Prometheus Operator; the ServiceMonitor,
// the rules and the node agent's PodMonitor each wait for their own CRD,
// and carry the selection labels.
func (r *GPUReconciler) desired(o gpuObserved) gpuDesired {
	var d gpuDesired
	want := func(yes bool, obj client.Object) {
		if yes {
			d.ensure = append(d.ensure, obj)
		} else {
			d.remove = append(d.remove, obj)
		}
	}
	exporter := o.policy.Spec.OperandEnabled(gpuv1alpha1.OperandDCGMExporter)
	want(exporter, ExporterService(r.Namespace))
	// Loom's counters, unless the policy names a ConfigMap of its own (one
	// that names Loom's, the default written out, still mounts Loom's).
	want(exporter && o.policy.Spec.DCGMExporter.CountersConfigMap() == CountersConfigMap, CountersConfig(r.Namespace))
	if r.DashboardsNamespace != "" {
		want(true, Dashboards(r.DashboardsNamespace))
	}
	for i := range o.dashboards {
		// Dashboards turned off, or moved: Loom's elsewhere go.
		if cm := &o.dashboards[i]; cm.Name == DashboardsConfigMap && cm.Namespace != r.DashboardsNamespace {
			want(false, cm)
		}
	}
	nsLabels := func(string) map[string]string { return o.nsLabels }
	selection := func(kind, component string) Selection {
		return Select(o.proms, Object{Kind: kind, Namespace: r.Namespace, Labels: ownedLabels(component)}, r.Labels, nsLabels)
	}
	if o.missing.has(KindServiceMonitor) {
		sel := selection(KindServiceMonitor, gpuv1alpha1.OperandDCGMExporter)
		want(exporter, ExporterServiceMonitor(r.Namespace, sel.Labels))
		if exporter {
			d.parts = append(d.parts, selected{KindServiceMonitor, r.Namespace + "/" + ExporterName, sel})
		}
	}
	if o.metricsService != nil {
		// Written by writeManagerMonitor, owned by the Service.
		d.parts = append(d.parts, selected{KindServiceMonitor, r.Namespace + "/" + ManagerServiceMonitorName, r.managerSelection(o)})
	} else if r.Manager.Service != "" && o.missing.has(KindServiceMonitor) {
		d.notes = append(d.notes, fmt.Sprintf("no Service %s/%s (--metrics-service-monitor) exists, so the manager's metrics, "+
			"which the GPU alerts read, are not scraped", r.Namespace, r.Manager.Service))
	}
	if o.missing.has(KindPrometheusRule) {
		sel := selection(KindPrometheusRule, componentAlerts)
		want(true, GPURule(r.Namespace, sel.Labels))
		d.parts = append(d.parts, selected{KindPrometheusRule, r.Namespace + "/" + RuleName, sel})
	}
	if o.missing.has(KindPodMonitor) {
		sel := selection(KindPodMonitor, componentNodeAgent)
		want(true, NodeAgentPodMonitor(r.Namespace, sel.Labels))
		d.parts = append(d.parts, selected{KindPodMonitor, r.Namespace + "/" + NodeAgentPodMonitorName, sel})
	}
	return d
}

// conflictRecheck is how often a name conflict is looked at again while
// it lasts (reads only, but for a Service a create that the name refuses).
const conflictRecheck = time.Minute

// gpuCondition is the policy's Monitoring condition: a name conflict, the
// Prometheus Operator missing, or which Prometheus selects the children,
// after the CRDs missing for some of them; never True while dcgm-exporter,
// the source of the metrics, is disabled or not scraped for want of the
// ServiceMonitor CRD.
func gpuCondition(o gpuObserved, d gpuDesired, conflict *apply.ForeignError) metav1.Condition {
	if conflict != nil {
		return conflictCondition(ConditionMonitoring, conflict)
	}
	exporter := o.policy.Spec.OperandEnabled(gpuv1alpha1.OperandDCGMExporter)
	if len(d.parts) == 0 {
		return waitingForOperator(ConditionMonitoring,
			o.missing.of(KindServiceMonitor, KindPodMonitor, KindPrometheusRule, monitoringv1.PrometheusesKind))
	}
	cond := selectionCondition(ConditionMonitoring, o.missing.prometheusesReadable(), o.proms, d.parts)
	var notes []string
	if crd := o.missing.of(KindServiceMonitor); exporter && len(crd) > 0 {
		notes = append(notes, fmt.Sprintf("no ServiceMonitor CRD (%s) is installed, so dcgm-exporter's GPU metrics are not scraped", crd[0]))
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonOperatorMissing
	}
	if crd := o.missing.of(KindPrometheusRule); len(crd) > 0 {
		notes = append(notes, fmt.Sprintf("no PrometheusRule CRD (%s) is installed, so Loom's GPU alerts and recording rules are not written", crd[0]))
	}
	if crd := o.missing.of(KindPodMonitor); len(crd) > 0 {
		notes = append(notes, fmt.Sprintf("no PodMonitor CRD (%s) is installed, so the node agent's metrics are not scraped", crd[0]))
	}
	notes = append(notes, d.notes...)
	notes = append(notes, enforcementNotes(o.proms, d.parts)...)
	if len(notes) > 0 {
		// First: a long selection message is cut at its end.
		cond.Message = strings.Join(notes, "; ") + "; " + cond.Message
	}
	if !exporter && cond.Status == metav1.ConditionTrue {
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonExporterDisabled
		cond.Message = "dcgm-exporter is disabled in the policy, so there are no GPU metrics; " + cond.Message
	}
	return cond
}

// enforcementNotes name the Prometheus objects that select dcgm-exporter's
// ServiceMonitor or the GPU rules and enforce a namespace label on them
// (enforcedNamespaceLabel, multi-tenant setups): every GPU series scraped
// through the ServiceMonitor then carries Loom's namespace, not the
// workload's from dcgm-exporter's pod mapping, and every rule reads only
// the series of Loom's namespace, unless the object is listed in the
// Prometheus's excludedFromEnforcement.
func enforcementNotes(proms []*monitoringv1.Prometheus, parts []selected) []string {
	resources := map[string]string{KindServiceMonitor: "servicemonitors", KindPrometheusRule: "prometheusrules"}
	var notes []string
	for _, p := range proms {
		label := p.Spec.EnforcedNamespaceLabel
		if label == "" {
			continue
		}
		var enforced []string
		for _, part := range parts {
			resource, ok := resources[part.kind]
			// The manager's series are of Loom's namespace anyway.
			if !ok || strings.HasSuffix(part.key, "/"+ManagerServiceMonitorName) || !slices.Contains(part.sel.SelectedBy, ref(p)) {
				continue
			}
			ns, name, _ := strings.Cut(part.key, "/")
			if !slices.ContainsFunc(p.Spec.ExcludedFromEnforcement, func(e monitoringv1.ObjectReference) bool {
				return (e.Group == "" || e.Group == monitoringv1.SchemeGroupVersion.Group) && e.Resource == resource &&
					e.Namespace == ns && (e.Name == "" || e.Name == name)
			}) {
				enforced = append(enforced, fmt.Sprintf("%s %s (resource %s)", part.kind, part.key, resource))
			}
		}
		if len(enforced) > 0 {
			notes = append(notes, fmt.Sprintf("%s enforces label %s on %s (enforcedNamespaceLabel): the GPU series lose the workload's %s "+
				"and the rules read only the series of their own namespace; list them in its excludedFromEnforcement",
				ref(p), label, strings.Join(enforced, " and "), label))
		}
	}
	return notes
}

// selected is one object and its selection, for the condition message.
type selected struct {
	kind, key string
	sel       Selection
}

func waitingForOperator(conditionType string, missing []string) metav1.Condition {
	return metav1.Condition{Type: conditionType, Status: metav1.ConditionFalse, Reason: ReasonOperatorMissing,
		Message: fmt.Sprintf("waiting for the Prometheus Operator: CRD %s not installed; monitors and rules are created as soon as it is",
			strings.Join(missing, ", "))}
}

// selectionCondition is True when a Prometheus selects every object, and
// otherwise names, per Prometheus, the label or namespace that is missing.
// Without a Prometheus or PrometheusAgent CRD (readable false) there is
// nothing to check the selection against: whatever scrapes the monitors
// (Grafana Alloy, an OpenTelemetry target allocator) selects them by its
// own configuration, and the condition says they are written. With
// PrometheusAgents only, the rules are written but no agent evaluates them.
func selectionCondition(conditionType string, readable bool, proms []*monitoringv1.Prometheus, parts []selected) metav1.Condition {
	cond := metav1.Condition{Type: conditionType}
	var keys []string
	for _, p := range parts {
		keys = append(keys, p.kind+" "+p.key)
	}
	if !readable {
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonWritten
		cond.Message = strings.Join(keys, ", ") + " written; no Prometheus CRD is installed, so there is no Prometheus object" +
			" to check their selection against (whatever reads them selects them by its own configuration)"
		return cond
	}
	if len(proms) == 0 {
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNoPrometheus
		cond.Message = strings.Join(keys, ", ") + " written, but there is no Prometheus object in the cluster to select them"
		return cond
	}
	agentsOnly := !slices.ContainsFunc(proms, func(p *monitoringv1.Prometheus) bool { return !isAgent(p) })
	var ok, notOK []string
	for _, p := range parts {
		if p.kind == KindPrometheusRule && agentsOnly {
			var agents []string
			for _, a := range proms {
				agents = append(agents, ref(a))
			}
			ok = append(ok, fmt.Sprintf("%s %s written, but no Prometheus evaluates it: only %s, and an agent evaluates no rules",
				p.kind, p.key, joinCapped(agents, ", ")))
			continue
		}
		if len(p.sel.SelectedBy) == 0 {
			notOK = append(notOK, fmt.Sprintf("no Prometheus selects %s %s (%s)", p.kind, p.key, joinCapped(p.sel.Why, "; ")))
			continue
		}
		paused := pausedOf(proms, p.sel.SelectedBy)
		if len(paused) == len(p.sel.SelectedBy) {
			notOK = append(notOK, fmt.Sprintf("%s %s is selected only by %s, paused (spec.paused: the operator loads no new monitors or rules into it until resumed)",
				p.kind, p.key, strings.Join(paused, ", ")))
			continue
		}
		s := fmt.Sprintf("%s %s selected by %s", p.kind, p.key, strings.Join(p.sel.SelectedBy, ", "))
		if len(paused) > 0 {
			s += fmt.Sprintf(" (%s paused: it loads nothing new until resumed)", strings.Join(paused, ", "))
		}
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

// pausedOf are the refs among refs of the Prometheus objects that are
// paused: the operator no longer reconciles their configuration, so a
// monitor or rule they select is not loaded until they are resumed.
func pausedOf(proms []*monitoringv1.Prometheus, refs []string) []string {
	var out []string
	for _, p := range proms {
		if p.Spec.Paused && slices.Contains(refs, ref(p)) {
			out = append(out, ref(p))
		}
	}
	return out
}

// prometheuses reads the Prometheus objects and the PrometheusAgents (as
// AgentAsPrometheus), of the kinds whose CRD is installed, oldest first.
func prometheuses(ctx context.Context, c client.Reader, missing crdsMissing) ([]*monitoringv1.Prometheus, error) {
	var out []*monitoringv1.Prometheus
	if missing.has(monitoringv1.PrometheusesKind) {
		list := &monitoringv1.PrometheusList{}
		if err := c.List(ctx, list); err != nil {
			return nil, err
		}
		for i := range list.Items {
			if list.Items[i].DeletionTimestamp == nil {
				out = append(out, &list.Items[i])
			}
		}
	}
	if missing.has(KindPrometheusAgent) {
		list := &monitoringv1alpha1.PrometheusAgentList{}
		if err := c.List(ctx, list); err != nil {
			return nil, err
		}
		for i := range list.Items {
			if list.Items[i].DeletionTimestamp == nil {
				out = append(out, AgentAsPrometheus(&list.Items[i]))
			}
		}
	}
	SortPrometheuses(out)
	return out, nil
}

// namespaceLabels reads a namespace's labels from the metadata cache.
func namespaceLabels(ctx context.Context, c client.Reader, name string) map[string]string {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := c.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
		return map[string]string{corev1.LabelMetadataName: name}
	}
	return ns.Labels
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
