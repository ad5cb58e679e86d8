package monitoring

import (
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	monitoringv1alpha1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func prom(ns, name string, age time.Duration, spec monitoringv1.PrometheusSpec) *monitoringv1.Prometheus {
	return &monitoringv1.Prometheus{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-age))},
		Spec:       spec,
	}
}

func agent(ns, name string, age time.Duration, release string) *monitoringv1.Prometheus {
	return AgentAsPrometheus(&monitoringv1alpha1.PrometheusAgent{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-age))},
		Spec:       monitoringv1alpha1.PrometheusAgentSpec{CommonPrometheusFields: kpsSpec(release).CommonPrometheusFields},
	})
}

func kpsSpec(release string) monitoringv1.PrometheusSpec {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"release": release}}
	all := &metav1.LabelSelector{}
	return monitoringv1.PrometheusSpec{
		CommonPrometheusFields: monitoringv1.CommonPrometheusFields{
			ServiceMonitorSelector: sel, ServiceMonitorNamespaceSelector: all,
			PodMonitorSelector: sel, PodMonitorNamespaceSelector: all,
		},
		RuleSelector: sel, RuleNamespaceSelector: all,
	}
}

// selectTest is one case of TestSelect.
type selectTest struct {
	name       string
	proms      []*monitoringv1.Prometheus
	obj        Object
	configured map[string]string
	wantLabels map[string]string
	wantBy     []string
	learned    string
	why        []string // substrings of Why
}

func selectTests() []selectTest {
	sm := Object{Kind: KindServiceMonitor, Namespace: "loom-system", Labels: ownedLabels("dcgm-exporter")}
	pm := Object{Kind: KindPodMonitor, Namespace: "ml", Labels: ownedLabels("trainingjob")}
	matchAll := monitoringv1.PrometheusSpec{CommonPrometheusFields: monitoringv1.CommonPrometheusFields{
		ServiceMonitorSelector: &metav1.LabelSelector{}, PodMonitorSelector: &metav1.LabelSelector{}}}
	expr := kpsSpec("x")
	expr.ServiceMonitorSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"gpu"}}}}
	ignoring := kpsSpec("kps")
	ignoring.IgnoreNamespaceSelectors = true
	teamNS := kpsSpec("kps")
	teamNS.PodMonitorNamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "infra"}}
	// The Prometheus CRD does not validate selectors: a value no label can
	// have is stored, and the operator fails on it.
	broken := kpsSpec("my release")

	return []selectTest{
		{name: "no Prometheus", obj: sm},
		{
			name: "kube-prometheus-stack: release label learned", obj: sm,
			proms:      []*monitoringv1.Prometheus{prom("monitoring", "kps", time.Hour, kpsSpec("kps"))},
			wantLabels: map[string]string{"release": "kps"}, wantBy: []string{"Prometheus monitoring/kps"}, learned: "Prometheus monitoring/kps",
		},
		{
			name: "oldest learnable Prometheus wins", obj: sm,
			proms: []*monitoringv1.Prometheus{
				prom("monitoring", "old", 2*time.Hour, kpsSpec("old")),
				prom("monitoring", "new", time.Hour, kpsSpec("new")),
			},
			wantLabels: map[string]string{"release": "old"}, wantBy: []string{"Prometheus monitoring/old"}, learned: "Prometheus monitoring/old",
			why: []string{"Prometheus monitoring/new: serviceMonitorSelector {release=new} needs label release=new"},
		},
		{
			name: "ignoreNamespaceSelectors concerns the monitors' own selectors, not the Prometheus's", obj: sm,
			proms:      []*monitoringv1.Prometheus{prom("monitoring", "kps", time.Hour, ignoring)},
			wantLabels: map[string]string{"release": "kps"}, wantBy: []string{"Prometheus monitoring/kps"}, learned: "Prometheus monitoring/kps",
		},
		{
			name: "an empty selector selects already: nothing learned", obj: sm,
			proms: []*monitoringv1.Prometheus{prom("loom-system", "all", time.Hour, matchAll)}, wantBy: []string{"Prometheus loom-system/all"},
		},
		{
			name: "nil namespace selector: own namespace only", obj: sm,
			proms: []*monitoringv1.Prometheus{prom("monitoring", "all", time.Hour, matchAll)},
			why:   []string{"serviceMonitorNamespaceSelector is unset, so it reads ServiceMonitors only in its own namespace monitoring, not loom-system"},
		},
		{
			name: "nil label selector selects none", obj: Object{Kind: KindPrometheusRule, Namespace: "loom-system"},
			proms: []*monitoringv1.Prometheus{prom("loom-system", "all", time.Hour, matchAll)},
			why:   []string{"ruleSelector is unset, so it selects no PrometheusRules"},
		},
		{
			name: "expressions cannot be learned", obj: sm,
			proms: []*monitoringv1.Prometheus{prom("monitoring", "expr", time.Hour, expr)},
			why:   []string{"serviceMonitorSelector {team in (gpu)} needs labels matching team in (gpu)"},
		},
		{
			name: "configured labels are kept, and the miss is named", obj: sm, configured: map[string]string{"release": "other"},
			proms:      []*monitoringv1.Prometheus{prom("monitoring", "kps", time.Hour, kpsSpec("kps"))},
			wantLabels: map[string]string{"release": "other"},
			why:        []string{"Prometheus monitoring/kps: serviceMonitorSelector {release=kps} needs label release=kps"},
		},
		{
			name: "a PrometheusAgent selects monitors as a Prometheus does", obj: pm,
			proms:      []*monitoringv1.Prometheus{agent("monitoring", "agent", time.Hour, "agent")},
			wantLabels: map[string]string{"release": "agent"}, wantBy: []string{"PrometheusAgent monitoring/agent"}, learned: "PrometheusAgent monitoring/agent",
		},
		{
			name: "a PrometheusAgent evaluates no rules: left out for them", obj: Object{Kind: KindPrometheusRule, Namespace: "loom-system"},
			proms:      []*monitoringv1.Prometheus{agent("monitoring", "agent", 2*time.Hour, "agent"), prom("monitoring", "kps", time.Hour, kpsSpec("kps"))},
			wantLabels: map[string]string{"release": "kps"}, wantBy: []string{"Prometheus monitoring/kps"}, learned: "Prometheus monitoring/kps",
		},
		{
			name: "a selector no label can satisfy is not learned", obj: sm,
			proms: []*monitoringv1.Prometheus{prom("monitoring", "broken", time.Hour, broken)},
			why:   []string{"Prometheus monitoring/broken: its serviceMonitorSelector is invalid"},
		},
		{
			name: "an older broken Prometheus gives no labels: the next learnable one does", obj: pm,
			proms:      []*monitoringv1.Prometheus{prom("monitoring", "broken", 2*time.Hour, broken), prom("monitoring", "kps", time.Hour, teamNS)},
			wantLabels: map[string]string{"release": "kps"}, learned: "Prometheus monitoring/kps",
			why: []string{"Prometheus monitoring/broken: its podMonitorSelector is invalid", "does not select namespace ml"},
		},
		{
			name: "namespace not selected is named, even with the label", obj: pm,
			proms:      []*monitoringv1.Prometheus{prom("monitoring", "kps", time.Hour, teamNS)},
			wantLabels: map[string]string{"release": "kps"}, learned: "Prometheus monitoring/kps",
			why: []string{"podMonitorNamespaceSelector {team=infra} does not select namespace ml"},
		},
	}
}

func TestSelect(t *testing.T) {
	nsLabels := func(ns string) map[string]string {
		return map[string]string{"kubernetes.io/metadata.name": ns, "team": map[string]string{"ml": "ml"}[ns]}
	}
	for _, tt := range selectTests() {
		t.Run(tt.name, func(t *testing.T) {
			SortPrometheuses(tt.proms)
			got := Select(tt.proms, tt.obj, tt.configured, nsLabels)
			if formatLabels(got.Labels) != formatLabels(tt.wantLabels) {
				t.Errorf("labels %v, want %v", got.Labels, tt.wantLabels)
			}
			if strings.Join(got.SelectedBy, ",") != strings.Join(tt.wantBy, ",") {
				t.Errorf("selected by %v, want %v", got.SelectedBy, tt.wantBy)
			}
			if got.Learned != tt.learned {
				t.Errorf("learned from %q, want %q", got.Learned, tt.learned)
			}
			for _, w := range tt.why {
				if !strings.Contains(strings.Join(got.Why, "\n"), w) {
					t.Errorf("why %q lacks %q", got.Why, w)
				}
			}
		})
	}
}
