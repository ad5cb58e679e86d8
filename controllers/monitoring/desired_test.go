package monitoring

import (
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
)

// TestConditionChange: an unchanged condition is no change (the writer
// skips it), a new message keeps the transition time, a new status moves it.
func TestConditionChange(t *testing.T) {
	then := metav1.NewTime(time.Unix(1e9, 0))
	now := time.Unix(2e9, 0)
	cur := metav1.Condition{Type: ConditionMonitoring, Status: metav1.ConditionTrue, Reason: ReasonSelected, Message: "m",
		ObservedGeneration: 3, LastTransitionTime: then}
	conds := []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}, cur}
	cond := metav1.Condition{Type: ConditionMonitoring, Status: metav1.ConditionTrue, Reason: ReasonSelected, Message: "m"}

	old, want := conditionChange(conds, cond, 3, now)
	if !apiequality.Semantic.DeepEqual(old, want) {
		t.Errorf("unchanged condition: old %+v, want %+v", old, want)
	}
	if len(old.Conditions) != 1 || old.Conditions[0].Type != ConditionMonitoring {
		t.Errorf("old holds %+v, want the Monitoring condition only", old.Conditions)
	}

	cond.Message = "other"
	if _, want = conditionChange(conds, cond, 3, now); !want.Conditions[0].LastTransitionTime.Equal(&then) {
		t.Errorf("a new message moved the transition time: %+v", want.Conditions[0])
	}
	cond.Status = metav1.ConditionFalse
	if _, want = conditionChange(conds, cond, 4, now); want.Conditions[0].LastTransitionTime.Unix() != now.Unix() ||
		want.Conditions[0].ObservedGeneration != 4 {
		t.Errorf("a new status: %+v", want.Conditions[0])
	}
	if old, _ = conditionChange(nil, cond, 1, now); len(old.Conditions) != 0 {
		t.Errorf("no condition yet: old %+v", old)
	}
}

// operatorMissing: none of the Prometheus Operator's CRDs is installed.
func operatorMissing() crdsMissing {
	return crdsMissing{KindServiceMonitor: "servicemonitors.monitoring.coreos.com", KindPodMonitor: "podmonitors.monitoring.coreos.com",
		KindPrometheusRule: "prometheusrules.monitoring.coreos.com", monitoringv1.PrometheusesKind: "prometheuses.monitoring.coreos.com",
		KindPrometheusAgent: "prometheusagents.monitoring.coreos.com"}
}

func names(objs []client.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetObjectKind().GroupVersionKind().Kind+" "+o.GetNamespace()+"/"+o.GetName())
	}
	return out
}

// TestGPUDesired: without the operator only the Service, counters and
// dashboards; with dcgm-exporter disabled its children are removed and the
// condition is never True; stale dashboards elsewhere go.
func TestGPUDesired(t *testing.T) {
	r := &GPUReconciler{Namespace: loomNS, DashboardsNamespace: "grafana"}
	policy := &gpuv1alpha1.ClusterPolicy{}
	stale := corev1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: DashboardsConfigMap}}
	o := gpuObserved{policy: policy, missing: operatorMissing(),
		dashboards: []corev1.ConfigMap{stale}}
	d := r.desired(o)
	if got := names(d.ensure); len(got) != 3 || got[2] != "ConfigMap grafana/"+DashboardsConfigMap {
		t.Errorf("ensure %v", got)
	}
	if got := names(d.remove); len(got) != 1 || got[0] != "ConfigMap "+loomNS+"/"+DashboardsConfigMap {
		t.Errorf("remove %v", got)
	}
	if c := gpuCondition(o, d, nil); c.Reason != ReasonOperatorMissing {
		t.Errorf("condition %+v", c)
	}

	policy.Spec.DCGMExporter.Enabled = ptr.To(false)
	matchAll := &metav1.LabelSelector{}
	all := &monitoringv1.Prometheus{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: "all"}, Spec: monitoringv1.PrometheusSpec{RuleSelector: matchAll}}
	all.Spec.PodMonitorSelector = matchAll
	o = gpuObserved{policy: policy, proms: []*monitoringv1.Prometheus{all}}
	d = r.desired(o)
	// The rules and the node agent's PodMonitor stay: neither is
	// dcgm-exporter's.
	if got := names(d.ensure); len(got) != 3 || got[1] != "PrometheusRule "+loomNS+"/"+RuleName || got[2] != "PodMonitor "+loomNS+"/"+NodeAgentPodMonitorName {
		t.Errorf("ensure %v", got)
	}
	if got := names(d.remove); len(got) != 3 || got[2] != "ServiceMonitor "+loomNS+"/"+ExporterName {
		t.Errorf("remove %v", got)
	}
	if c := gpuCondition(o, d, nil); c.Reason != ReasonExporterDisabled || c.Status != metav1.ConditionFalse {
		t.Errorf("condition %+v", c)
	}
	// The manager's own ServiceMonitor (written apart, owned by its
	// Service) is in the condition whatever dcgm-exporter: the inventory
	// metrics come from the manager.
	r.Manager = ManagerScrape{Service: "loom-metrics", Secure: true}
	o.metricsService = &metav1.PartialObjectMetadata{}
	d = r.desired(o)
	if len(d.parts) != 3 || d.parts[0].key != loomNS+"/"+ManagerServiceMonitorName || len(d.ensure) != 3 {
		t.Errorf("parts %+v, ensure %v", d.parts, names(d.ensure))
	}
	// Its Service missing (a wrong name, or not created yet): said.
	o.metricsService = nil
	d = r.desired(o)
	want := "no Service loom-system/loom-metrics (--metrics-service-monitor) exists, so the manager's metrics, which the GPU alerts read, are not scraped"
	if c := gpuCondition(o, d, nil); len(d.parts) != 2 || !strings.Contains(c.Message, want) {
		t.Errorf("parts %+v, condition %q lacks %q", d.parts, c.Message, want)
	}
}

// TestUsersServiceIsLeftAlone: a Service of the exporter's name that is not
// Loom's (and so not in the manager's cache) is not taken over, and the
// policy's condition names it.
func TestUsersServiceIsLeftAlone(t *testing.T) {
	startManager(t, func(o *manager.Options) { o.GrafanaDashboards = false })
	if err := env.CreateNamespace(ctx(), loomNS); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: key(loomNS, ExporterName), Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Name: "mine", Port: 80}}}}
	if err := env.Client.Create(ctx(), svc); err != nil {
		t.Fatal(err)
	}
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	c := policyCondition(t, cp, ReasonConflict)
	if c.Status != metav1.ConditionFalse {
		t.Errorf("condition %+v", c)
	}
	if err := env.Client.Get(ctx(), client.ObjectKeyFromObject(svc), svc); err != nil {
		t.Fatal(err)
	}
	if len(svc.OwnerReferences) != 0 || svc.Spec.Ports[0].Name != "mine" {
		t.Errorf("the user's Service was changed: %+v", svc)
	}
}

// TestPolicyNamingLoomsCounters: a policy that names Loom's own counters
// ConfigMap (the default, written out, as a GitOps tool or a copy of the
// effective spec does) keeps it: dcgm-exporter mounts that name, and a
// removed ConfigMap would leave its pods unable to start.
func TestPolicyNamingLoomsCounters(t *testing.T) {
	r := &GPUReconciler{Namespace: loomNS}
	policy := &gpuv1alpha1.ClusterPolicy{}
	policy.Spec.DCGMExporter.MetricsConfigMapName = gpuv1alpha1.DefaultDCGMCountersConfigMap
	d := r.desired(gpuObserved{policy: policy, missing: operatorMissing()})
	if got := names(d.remove); slices.Contains(got, "ConfigMap "+loomNS+"/"+CountersConfigMap) {
		t.Errorf("the ConfigMap the policy names is removed: remove %v", got)
	}
	if got := names(d.ensure); !slices.Contains(got, "ConfigMap "+loomNS+"/"+CountersConfigMap) {
		t.Errorf("ensure %v lacks Loom's counters", got)
	}
	// The policy's own ConfigMap: Loom's goes.
	policy.Spec.DCGMExporter.MetricsConfigMapName = "my-counters"
	d = r.desired(gpuObserved{policy: policy, missing: operatorMissing()})
	if got := names(d.remove); !slices.Contains(got, "ConfigMap "+loomNS+"/"+CountersConfigMap) {
		t.Errorf("remove %v lacks Loom's counters", got)
	}
}

// TestGPUConditionPartialCRDs: each Prometheus Operator kind is written as
// soon as its own CRD is installed, and the condition names every missing
// CRD with what it costs; a missing ServiceMonitor CRD (dcgm-exporter's
// metrics unscraped) holds it False.
func TestGPUConditionPartialCRDs(t *testing.T) {
	r := &GPUReconciler{Namespace: loomNS, DashboardsNamespace: "grafana"}
	matchAll := &metav1.LabelSelector{}
	all := &monitoringv1.Prometheus{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: "all"}, Spec: monitoringv1.PrometheusSpec{RuleSelector: matchAll}}
	all.Spec.ServiceMonitorSelector, all.Spec.PodMonitorSelector = matchAll, matchAll
	without := func(kinds ...string) crdsMissing {
		m := operatorMissing()
		for k := range m {
			if !slices.Contains(kinds, k) {
				delete(m, k)
			}
		}
		return m
	}
	for _, tt := range []struct {
		name       string
		missing    crdsMissing
		proms      []*monitoringv1.Prometheus
		wantKinds  []string
		wantStatus metav1.ConditionStatus
		wantReason string
		wantSays   []string
	}{
		{"monitor CRDs only", without(KindPrometheusRule, monitoringv1.PrometheusesKind, KindPrometheusAgent), nil,
			[]string{KindServiceMonitor, KindPodMonitor}, metav1.ConditionTrue, ReasonWritten,
			[]string{"no PrometheusRule CRD (prometheusrules.monitoring.coreos.com) is installed, so Loom's GPU alerts and recording rules are not written",
				"no Prometheus CRD is installed"}},
		{"no ServiceMonitor CRD", without(KindServiceMonitor), []*monitoringv1.Prometheus{all},
			[]string{KindPrometheusRule, KindPodMonitor}, metav1.ConditionFalse, ReasonOperatorMissing,
			[]string{"no ServiceMonitor CRD (servicemonitors.monitoring.coreos.com) is installed, so dcgm-exporter's GPU metrics are not scraped"}},
		{"no PodMonitor CRD", without(KindPodMonitor), []*monitoringv1.Prometheus{all},
			[]string{KindServiceMonitor, KindPrometheusRule}, metav1.ConditionTrue, ReasonSelected,
			[]string{"no PodMonitor CRD (podmonitors.monitoring.coreos.com) is installed, so the node agent's metrics are not scraped"}},
		{"none", operatorMissing(), nil, nil, metav1.ConditionFalse, ReasonOperatorMissing,
			[]string{"waiting for the Prometheus Operator: CRD servicemonitors.monitoring.coreos.com, podmonitors.monitoring.coreos.com, prometheusrules.monitoring.coreos.com, prometheuses.monitoring.coreos.com not installed"}},
		{"all", crdsMissing{}, []*monitoringv1.Prometheus{all},
			[]string{KindServiceMonitor, KindPrometheusRule, KindPodMonitor}, metav1.ConditionTrue, ReasonSelected, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := gpuObserved{policy: &gpuv1alpha1.ClusterPolicy{}, missing: tt.missing, proms: tt.proms}
			d := r.desired(o)
			var kinds []string
			for _, obj := range d.ensure {
				if gvk := obj.GetObjectKind().GroupVersionKind(); gvk.Group == monitoringv1.SchemeGroupVersion.Group {
					kinds = append(kinds, gvk.Kind)
				}
			}
			if !slices.Equal(kinds, tt.wantKinds) {
				t.Errorf("written %v, want %v", kinds, tt.wantKinds)
			}
			c := gpuCondition(o, d, nil)
			if c.Status != tt.wantStatus || c.Reason != tt.wantReason {
				t.Errorf("condition %s/%s, want %s/%s: %s", c.Status, c.Reason, tt.wantStatus, tt.wantReason, c.Message)
			}
			for _, s := range tt.wantSays {
				if !strings.Contains(c.Message, s) {
					t.Errorf("message %q does not say %q", c.Message, s)
				}
			}
		})
	}
}

// TestGPUConditionNamesEnforcedNamespaceLabel: a Prometheus that enforces
// a namespace label (enforcedNamespaceLabel, as multi-tenant setups do)
// would give every GPU series Loom's namespace instead of the workload's,
// and confine the rules to Loom's namespace: the condition names it and
// the objects to list in its excludedFromEnforcement, until they are. The
// manager's own ServiceMonitor is not named: its series are of Loom's
// namespace anyway.
func TestGPUConditionNamesEnforcedNamespaceLabel(t *testing.T) {
	r := &GPUReconciler{Namespace: loomNS, Manager: ManagerScrape{Service: "loom-metrics", Secure: true}}
	matchAll := &metav1.LabelSelector{}
	prom := func(excluded ...monitoringv1.ObjectReference) *monitoringv1.Prometheus {
		p := &monitoringv1.Prometheus{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: "tenant"}}
		p.Spec.ServiceMonitorSelector, p.Spec.PodMonitorSelector, p.Spec.RuleSelector = matchAll, matchAll, matchAll
		p.Spec.EnforcedNamespaceLabel = "namespace"
		p.Spec.ExcludedFromEnforcement = excluded
		return p
	}
	const note = "Prometheus loom-system/tenant enforces label namespace on "
	for _, tt := range []struct {
		name string
		prom *monitoringv1.Prometheus
		want string // "": no note
	}{
		{"enforced", prom(), note + "ServiceMonitor loom-system/loom-dcgm-exporter (resource servicemonitors) and " +
			"PrometheusRule loom-system/loom-gpu (resource prometheusrules) (enforcedNamespaceLabel)"},
		{"the rules excluded", prom(monitoringv1.ObjectReference{Resource: "prometheusrules", Namespace: loomNS, Name: RuleName}),
			note + "ServiceMonitor loom-system/loom-dcgm-exporter (resource servicemonitors) (enforcedNamespaceLabel)"},
		{"both excluded, the namespace's monitors by no name", prom(
			monitoringv1.ObjectReference{Group: "monitoring.coreos.com", Resource: "servicemonitors", Namespace: loomNS},
			monitoringv1.ObjectReference{Resource: "prometheusrules", Namespace: loomNS, Name: RuleName}), ""},
		{"another namespace's excluded", prom(
			monitoringv1.ObjectReference{Resource: "servicemonitors", Namespace: "other"},
			monitoringv1.ObjectReference{Resource: "prometheusrules", Namespace: loomNS, Name: RuleName}),
			note + "ServiceMonitor loom-system/loom-dcgm-exporter (resource servicemonitors) (enforcedNamespaceLabel)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := gpuObserved{policy: &gpuv1alpha1.ClusterPolicy{}, missing: crdsMissing{}, proms: []*monitoringv1.Prometheus{tt.prom},
				metricsService: &metav1.PartialObjectMetadata{}}
			c := gpuCondition(o, r.desired(o), nil)
			if c.Status != metav1.ConditionTrue || c.Reason != ReasonSelected {
				t.Errorf("condition %s %s %q", c.Status, c.Reason, c.Message)
			}
			if got := strings.Contains(c.Message, "enforcedNamespaceLabel"); tt.want == "" && got {
				t.Errorf("message %q names enforcement", c.Message)
			}
			if tt.want != "" && !strings.Contains(c.Message, tt.want) {
				t.Errorf("message %q lacks %q", c.Message, tt.want)
			}
		})
	}
}

// TestPausedPrometheusIsNoSelection: the operator reconciles nothing of a
// paused Prometheus, so a monitor only it selects is never loaded: the
// condition says so (NotSelected), and names a paused one beside others.
func TestPausedPrometheusIsNoSelection(t *testing.T) {
	r := &GPUReconciler{Namespace: loomNS}
	matchAll := &metav1.LabelSelector{}
	prom := func(name string, paused bool) *monitoringv1.Prometheus {
		p := &monitoringv1.Prometheus{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: name}}
		p.Spec.ServiceMonitorSelector, p.Spec.PodMonitorSelector, p.Spec.RuleSelector = matchAll, matchAll, matchAll
		p.Spec.Paused = paused
		return p
	}
	for _, tt := range []struct {
		name       string
		proms      []*monitoringv1.Prometheus
		wantStatus metav1.ConditionStatus
		wantReason string
		wantSays   string
	}{
		{"only a paused one", []*monitoringv1.Prometheus{prom("frozen", true)}, metav1.ConditionFalse, ReasonNotSelected,
			"ServiceMonitor loom-system/loom-dcgm-exporter is selected only by Prometheus loom-system/frozen, paused (spec.paused"},
		{"a paused one beside another", []*monitoringv1.Prometheus{prom("frozen", true), prom("live", false)}, metav1.ConditionTrue, ReasonSelected,
			"selected by Prometheus loom-system/frozen, Prometheus loom-system/live (Prometheus loom-system/frozen paused: it loads nothing new until resumed)"},
		{"none paused", []*monitoringv1.Prometheus{prom("live", false)}, metav1.ConditionTrue, ReasonSelected, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := gpuObserved{policy: &gpuv1alpha1.ClusterPolicy{}, missing: crdsMissing{}, proms: tt.proms}
			c := gpuCondition(o, r.desired(o), nil)
			if c.Status != tt.wantStatus || c.Reason != tt.wantReason {
				t.Errorf("condition %s %s %q, want %s %s", c.Status, c.Reason, c.Message, tt.wantStatus, tt.wantReason)
			}
			if tt.wantSays == "" && strings.Contains(c.Message, "paused") || !strings.Contains(c.Message, tt.wantSays) {
				t.Errorf("message %q, want %q", c.Message, tt.wantSays)
			}
		})
	}
}
