package monitoring

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	monitoringv1alpha1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Kinds of the objects Loom writes for Prometheus.
const (
	KindServiceMonitor = "ServiceMonitor"
	KindPodMonitor     = "PodMonitor"
	KindPrometheusRule = "PrometheusRule"
)

// KindPrometheusAgent marks, in the Prometheus objects selection reads, a
// PrometheusAgent: it selects ServiceMonitors and PodMonitors as a
// Prometheus does, and evaluates no rules (it has no rule selector).
const KindPrometheusAgent = monitoringv1alpha1.PrometheusAgentsKind

// AgentAsPrometheus is a PrometheusAgent as selection reads it: a Prometheus
// of kind PrometheusAgent with the agent's monitor selectors and no rule
// selector.
func AgentAsPrometheus(a *monitoringv1alpha1.PrometheusAgent) *monitoringv1.Prometheus {
	return &monitoringv1.Prometheus{TypeMeta: metav1.TypeMeta{Kind: KindPrometheusAgent}, ObjectMeta: a.ObjectMeta,
		Spec: monitoringv1.PrometheusSpec{CommonPrometheusFields: a.Spec.CommonPrometheusFields}}
}

func isAgent(p *monitoringv1.Prometheus) bool { return p.Kind == KindPrometheusAgent }

// ref names p with its kind, as conditions do: "Prometheus monitoring/kps".
func ref(p *monitoringv1.Prometheus) string {
	kind := monitoringv1.PrometheusesKind
	if isAgent(p) {
		kind = KindPrometheusAgent
	}
	return kind + " " + p.Namespace + "/" + p.Name
}

// selectors are the label and namespace selectors a Prometheus applies to
// one kind of object, with the field names a person would look for.
func selectors(p *monitoringv1.Prometheus, kind string) (sel, nsSel *metav1.LabelSelector, selField, nsField string) {
	switch kind {
	case KindServiceMonitor:
		return p.Spec.ServiceMonitorSelector, p.Spec.ServiceMonitorNamespaceSelector, "serviceMonitorSelector", "serviceMonitorNamespaceSelector"
	case KindPodMonitor:
		return p.Spec.PodMonitorSelector, p.Spec.PodMonitorNamespaceSelector, "podMonitorSelector", "podMonitorNamespaceSelector"
	default:
		return p.Spec.RuleSelector, p.Spec.RuleNamespaceSelector, "ruleSelector", "ruleNamespaceSelector"
	}
}

// Object is one object Loom writes for Prometheus to pick up.
type Object struct {
	Kind      string
	Namespace string
	// Labels the object carries (its own plus the selection labels).
	Labels map[string]string
}

// judge says whether Prometheus p selects o, following the Prometheus
// Operator: a nil label selector selects nothing, an empty one everything; a
// nil namespace selector means p's own namespace, an empty one every
// namespace. When p does not select o, the reason names what is missing.
func judge(p *monitoringv1.Prometheus, o Object, nsLabels map[string]string) (bool, string) {
	sel, nsSel, selField, nsField := selectors(p, o.Kind)
	if sel == nil {
		return false, fmt.Sprintf("its %s is unset, so it selects no %ss", selField, o.Kind)
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, fmt.Sprintf("its %s is invalid: %v", selField, err)
	}
	if !s.Matches(labels.Set(o.Labels)) {
		return false, fmt.Sprintf("%s %s needs %s", selField, describeSelector(sel), missing(sel, o.Labels))
	}
	// ignoreNamespaceSelectors concerns the monitors' own
	// spec.namespaceSelector, not which namespaces p reads them from.
	switch {
	case nsSel == nil && o.Namespace != p.Namespace:
		return false, fmt.Sprintf("its %s is unset, so it reads %ss only in its own namespace %s, not %s", nsField, o.Kind, p.Namespace, o.Namespace)
	case nsSel != nil:
		ns, err := metav1.LabelSelectorAsSelector(nsSel)
		if err != nil {
			return false, fmt.Sprintf("its %s is invalid: %v", nsField, err)
		}
		if !ns.Matches(labels.Set(nsLabels)) {
			return false, fmt.Sprintf("its %s %s does not select namespace %s", nsField, describeSelector(nsSel), o.Namespace)
		}
	}
	return true, ""
}

// missing names the labels o lacks (or has with another value) for sel's
// matchLabels, or the expressions it fails.
func missing(sel *metav1.LabelSelector, have map[string]string) string {
	var out []string
	for _, k := range sortedKeys(sel.MatchLabels) {
		if v := sel.MatchLabels[k]; have[k] != v {
			out = append(out, fmt.Sprintf("label %s=%s", k, v))
		}
	}
	for _, e := range sel.MatchExpressions {
		s, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{e}})
		if err == nil && !s.Matches(labels.Set(have)) {
			out = append(out, "labels matching "+s.String())
		}
	}
	return strings.Join(out, " and ")
}

func describeSelector(sel *metav1.LabelSelector) string {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return "{}"
	}
	return "{" + s.String() + "}"
}

// learnable returns the labels that make sel select an object, when sel
// is plain matchLabels (kube-prometheus-stack's release: <name>), and
// false when no set of labels can be derived (expressions), or none an
// object can carry: the Prometheus CRD stores a selector of any strings,
// and labels learned from one the API server refuses would fail every
// monitor's write.
func learnable(sel *metav1.LabelSelector) (map[string]string, bool) {
	if sel == nil || len(sel.MatchExpressions) > 0 {
		return nil, false
	}
	if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
		return nil, false
	}
	return sel.MatchLabels, true
}

// Selection is which Prometheus selects an object, with the labels the
// object needs for it.
type Selection struct {
	// Labels to add to the object for it to be selected (configured or
	// learned); nil when none are needed or none could be found.
	Labels map[string]string
	// SelectedBy are the Prometheus objects that select it, each named by
	// ref ("Prometheus monitoring/kps", "PrometheusAgent monitoring/agent").
	SelectedBy []string
	// Learned names (by ref) the Prometheus whose selector the labels come
	// from.
	Learned string
	// Why says, per Prometheus, why it does not select the object.
	Why []string
}

// Select decides the selection labels of o and who selects it. configured
// labels (the manager's --monitoring-labels) are always set. Without them,
// and when no Prometheus selects o already, Loom learns the labels of the
// oldest Prometheus whose selector is plain matchLabels and whose namespace
// selector admits o's namespace. proms is sorted by the caller (oldest
// first) and may hold PrometheusAgents (AgentAsPrometheus), which are left
// out for rules: an agent evaluates none. nsLabels returns a namespace's
// labels.
func Select(proms []*monitoringv1.Prometheus, o Object, configured map[string]string, nsLabels func(string) map[string]string) Selection {
	if o.Kind == KindPrometheusRule {
		proms = slices.DeleteFunc(slices.Clone(proms), isAgent)
	}
	with := func(extra map[string]string) Object {
		l := maps.Clone(o.Labels)
		if l == nil {
			l = map[string]string{}
		}
		maps.Copy(l, extra)
		return Object{Kind: o.Kind, Namespace: o.Namespace, Labels: l}
	}
	evaluate := func(extra map[string]string) Selection {
		s := Selection{Labels: extra}
		obj := with(extra)
		for _, p := range proms {
			if ok, why := judge(p, obj, nsLabels(o.Namespace)); ok {
				s.SelectedBy = append(s.SelectedBy, ref(p))
			} else {
				s.Why = append(s.Why, ref(p)+": "+why)
			}
		}
		return s
	}
	base := evaluate(configured)
	if len(configured) > 0 || len(base.SelectedBy) > 0 {
		return base
	}
	// Learn: the first Prometheus whose plain matchLabels select o. When
	// none does (a namespace selector shuts o out), o still carries the
	// first learnable labels, and the reasons name what else is missing.
	var first *Selection
	for _, p := range proms {
		sel, _, _, _ := selectors(p, o.Kind)
		l, ok := learnable(sel)
		if !ok || len(l) == 0 || conflicts(o.Labels, l) {
			continue
		}
		s := evaluate(l)
		s.Learned = ref(p)
		if slices.Contains(s.SelectedBy, s.Learned) {
			return s
		}
		if first == nil {
			first = &s
		}
	}
	if first != nil {
		return *first
	}
	return base
}

func conflicts(have, want map[string]string) bool {
	for k, v := range want {
		if cur, ok := have[k]; ok && cur != v {
			return true
		}
	}
	return false
}

// SortPrometheuses orders Prometheus objects oldest first (kind and name
// break ties), the order in which Loom learns selection labels.
func SortPrometheuses(ps []*monitoringv1.Prometheus) {
	sort.Slice(ps, func(i, j int) bool {
		ti, tj := ps[i].CreationTimestamp, ps[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return ref(ps[i]) < ref(ps[j])
	})
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
