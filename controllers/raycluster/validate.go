package raycluster

import (
	"errors"
	"fmt"
	"math"
	"strings"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/manager"
)

// Replica arithmetic. KubeRay's helpers (GetWorkerGroupDesiredReplicas,
// CalculateDesiredReplicas, ...) multiply and add int32s and overflow on
// hostile input (replicas × numOfHosts past 2^31); Loom computes every
// count in 64 bits, saturating, and converts to int32 only for the status.

// countCap is where sums of pod counts saturate: every product of two
// int32s is below it, and the sum of two counts below it fits an int64.
const countCap = 1 << 62

// groupPods is how many pods worker group g wants: replicas held within
// [minReplicas, maxReplicas] as KubeRay holds them (minReplicas above
// maxReplicas gives maxReplicas, a negative count none) times numOfHosts;
// a suspended group wants none.
func groupPods(g *rayv1.WorkerGroupSpec) int64 {
	if g.Suspend != nil && *g.Suspend {
		return 0
	}
	lo, hi := int64(ptr.Deref(g.MinReplicas, 0)), int64(ptr.Deref(g.MaxReplicas, math.MaxInt32))
	n := lo
	if g.Replicas != nil {
		n = int64(*g.Replicas)
	}
	return max(min(max(n, lo), hi), 0) * hosts(g)
}

// minPods and maxPods are the group's bounds in pods (none when suspended).
func minPods(g *rayv1.WorkerGroupSpec) int64 {
	if g.Suspend != nil && *g.Suspend {
		return 0
	}
	return max(int64(ptr.Deref(g.MinReplicas, 0)), 0) * hosts(g)
}

func maxPods(g *rayv1.WorkerGroupSpec) int64 {
	if g.Suspend != nil && *g.Suspend {
		return 0
	}
	return max(int64(ptr.Deref(g.MaxReplicas, math.MaxInt32)), 0) * hosts(g)
}

// hosts is the group's pods per replica (at least 1).
func hosts(g *rayv1.WorkerGroupSpec) int64 { return max(int64(g.NumOfHosts), 1) }

// add adds two counts, saturating at countCap.
func add(a, b int64) int64 { return min(max(a, 0)+max(b, 0), countCap) }

// workerPods adds count over the cluster's worker groups.
func workerPods(rc *rayv1.RayCluster, count func(*rayv1.WorkerGroupSpec) int64) int64 {
	var n int64
	for i := range rc.Spec.WorkerGroupSpecs {
		n = add(n, count(&rc.Spec.WorkerGroupSpecs[i]))
	}
	return n
}

// clamp32 is a count as the int32 of KubeRay's status and Volcano's
// PodGroup.
func clamp32(n int64) int32 { return int32(min(max(n, 0), math.MaxInt32)) }

// Validation: what KubeRay's validators and the API server would reject,
// or what would make a child's create fail, is reported on the cluster's
// spec-validity condition with the field named, and nothing is written.

// maxProblems is how many problems the condition lists; the rest are
// counted.
const maxProblems = 5

// problems collects a cluster's spec problems, each naming its field.
type problems struct {
	list []string
	more int
}

func (ps *problems) add(path *field.Path, format string, args ...any) {
	if len(ps.list) == maxProblems {
		ps.more++
		return
	}
	ps.list = append(ps.list, path.String()+": "+fmt.Sprintf(format, args...))
}

func (ps *problems) addList(errs field.ErrorList) {
	for _, e := range errs {
		ps.add(field.NewPath(e.Field), "%s", e.ErrorBody())
	}
}

func (ps *problems) full() bool { return len(ps.list) == maxProblems }

func (ps *problems) err() error {
	if len(ps.list) == 0 {
		return nil
	}
	msg := strings.Join(ps.list, "; ")
	if ps.more > 0 {
		msg += fmt.Sprintf("; and %d more", ps.more)
	}
	return errors.New(msg)
}

// quoted is s quoted for a message, cut to a readable length.
func quoted(s string) string {
	const most = 80
	if len(s) > most {
		return fmt.Sprintf("%q… (%d characters)", s[:most], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// validateCluster says what in the (normalized) cluster KubeRay's
// validators, the API server or its children's creates would reject, each
// problem with its field; nil when nothing.
func validateCluster(rc *rayv1.RayCluster, sched string) error {
	var ps problems
	if err := utils.ValidateRayClusterMetadata(rc.ObjectMeta); err != nil {
		ps.add(field.NewPath("metadata", "name"), "%s", err.Error())
	}
	kubeRaySpec(rc, &ps)
	groupNames(rc, &ps)
	replicaBounds(rc, &ps)
	serviceNames(rc, &ps)
	headPort(rc, &ps)
	exposed(rc, &ps)
	templateMeta(rc, &ps)
	templateScheduling(rc, &ps)
	gangLabels(rc, sched, &ps)
	return ps.err()
}

// gangLabels: a cluster gang-scheduled through Volcano (sched) names, in
// its ray.io/priority-class-name label, a name a PriorityClass can have
// (a DNS-1123 subdomain: a label value may hold capitals, or start with a
// dot or an underscore, which no PriorityClass name can): its PodGroup
// would ask Volcano for a priority that can never exist.
func gangLabels(rc *rayv1.RayCluster, sched string, ps *problems) {
	if sched != gang.SchedulerName {
		return
	}
	if v := rc.Labels[LabelPriorityClass]; v != "" {
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			ps.add(field.NewPath("metadata", "labels").Key(LabelPriorityClass), "%s is no PriorityClass name: %s", quoted(v), strings.Join(errs, "; "))
		}
	}
}

// templateScheduling: the pod templates' tolerations and affinity are what
// the API server admits in a pod (its rules, less those behind feature
// gates), so that a template every pod copies is refused before any pod
// or Service is made, naming its field, instead of each pod's create
// failing. Each template stops at its first problems (see problems).
func templateScheduling(rc *rayv1.RayCluster, ps *problems) {
	check := func(path *field.Path, spec *corev1.PodSpec) {
		for i := range spec.Tolerations {
			if ps.full() {
				return
			}
			toleration(path.Child("tolerations").Index(i), &spec.Tolerations[i], ps)
		}
		if a := spec.Affinity; a != nil {
			affinity(path.Child("affinity"), a, ps)
		}
	}
	check(field.NewPath("spec", "headGroupSpec", "template", "spec"), &rc.Spec.HeadGroupSpec.Template.Spec)
	for i := range rc.Spec.WorkerGroupSpecs {
		if ps.full() {
			return
		}
		check(field.NewPath("spec", "workerGroupSpecs").Index(i).Child("template", "spec"), &rc.Spec.WorkerGroupSpecs[i].Template.Spec)
	}
}

// toleration holds t to the API server's rules for a pod's toleration.
func toleration(path *field.Path, t *corev1.Toleration, ps *problems) {
	if t.Key != "" {
		ps.addList(metav1validation.ValidateLabelName(t.Key, path.Child("key")))
	}
	switch t.Operator {
	case corev1.TolerationOpExists:
		if t.Value != "" {
			ps.add(path.Child("value"), "must be empty when operator is Exists (got %s)", quoted(t.Value))
		}
	case corev1.TolerationOpEqual, "", corev1.TolerationOpLt, corev1.TolerationOpGt:
		if t.Key == "" {
			ps.add(path.Child("operator"), "must be Exists when key is empty (got %s)", quoted(string(t.Operator)))
		}
		if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
			ps.add(path.Child("value"), "%s: %s", quoted(t.Value), strings.Join(errs, "; "))
		}
	default:
		ps.add(path.Child("operator"), "unsupported value %s: supported values: \"Equal\", \"Exists\"", quoted(string(t.Operator)))
	}
	switch t.Effect {
	case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		ps.add(path.Child("effect"), "unsupported value %s: supported values: \"NoExecute\", \"NoSchedule\", \"PreferNoSchedule\"", quoted(string(t.Effect)))
	}
	if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
		ps.add(path.Child("effect"), "must be NoExecute when tolerationSeconds is set (got %s)", quoted(string(t.Effect)))
	}
}

// affinity holds a to the API server's rules for a pod's node affinity
// and pod (anti-)affinity.
func affinity(path *field.Path, a *corev1.Affinity, ps *problems) {
	if na := a.NodeAffinity; na != nil {
		p := path.Child("nodeAffinity")
		if r := na.RequiredDuringSchedulingIgnoredDuringExecution; r != nil {
			rp := p.Child("requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
			if len(r.NodeSelectorTerms) == 0 {
				ps.add(rp, "must have at least one node selector term")
			}
			for i := range r.NodeSelectorTerms {
				if ps.full() {
					return
				}
				nodeSelectorTerm(rp.Index(i), &r.NodeSelectorTerms[i], ps)
			}
		}
		for i, t := range na.PreferredDuringSchedulingIgnoredDuringExecution {
			if ps.full() {
				return
			}
			tp := p.Child("preferredDuringSchedulingIgnoredDuringExecution").Index(i)
			weight(tp.Child("weight"), t.Weight, ps)
			nodeSelectorTerm(tp.Child("preference"), &t.Preference, ps)
		}
	}
	for _, pa := range []struct {
		name      string
		required  []corev1.PodAffinityTerm
		preferred []corev1.WeightedPodAffinityTerm
	}{
		{"podAffinity", podAffinity(a.PodAffinity).RequiredDuringSchedulingIgnoredDuringExecution, podAffinity(a.PodAffinity).PreferredDuringSchedulingIgnoredDuringExecution},
		{"podAntiAffinity", podAntiAffinity(a.PodAntiAffinity).RequiredDuringSchedulingIgnoredDuringExecution, podAntiAffinity(a.PodAntiAffinity).PreferredDuringSchedulingIgnoredDuringExecution},
	} {
		p := path.Child(pa.name)
		for i := range pa.required {
			if ps.full() {
				return
			}
			podAffinityTerm(p.Child("requiredDuringSchedulingIgnoredDuringExecution").Index(i), &pa.required[i], ps)
		}
		for i := range pa.preferred {
			if ps.full() {
				return
			}
			tp := p.Child("preferredDuringSchedulingIgnoredDuringExecution").Index(i)
			weight(tp.Child("weight"), pa.preferred[i].Weight, ps)
			podAffinityTerm(tp.Child("podAffinityTerm"), &pa.preferred[i].PodAffinityTerm, ps)
		}
	}
}

func podAffinity(a *corev1.PodAffinity) corev1.PodAffinity {
	if a == nil {
		return corev1.PodAffinity{}
	}
	return *a
}

func podAntiAffinity(a *corev1.PodAntiAffinity) corev1.PodAntiAffinity {
	if a == nil {
		return corev1.PodAntiAffinity{}
	}
	return *a
}

func weight(path *field.Path, w int32, ps *problems) {
	if w < 1 || w > 100 {
		ps.add(path, "%d is not in the range 1-100", w)
	}
}

// nodeSelectorTerm holds a node selector term's requirements to the API
// server's rules: a label key, an operator, and the values it takes.
func nodeSelectorTerm(path *field.Path, t *corev1.NodeSelectorTerm, ps *problems) {
	for i, r := range t.MatchExpressions {
		if ps.full() {
			return
		}
		p := path.Child("matchExpressions").Index(i)
		ps.addList(metav1validation.ValidateLabelName(r.Key, p.Child("key")))
		switch r.Operator {
		case corev1.NodeSelectorOpIn, corev1.NodeSelectorOpNotIn:
			if len(r.Values) == 0 {
				ps.add(p.Child("values"), "must be specified when operator is %s", r.Operator)
			}
		case corev1.NodeSelectorOpExists, corev1.NodeSelectorOpDoesNotExist:
			if len(r.Values) > 0 {
				ps.add(p.Child("values"), "may not be specified when operator is %s", r.Operator)
			}
		case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
			if len(r.Values) != 1 {
				ps.add(p.Child("values"), "must be one value when operator is %s", r.Operator)
			}
		default:
			ps.add(p.Child("operator"), "unsupported value %s: supported values: \"DoesNotExist\", \"Exists\", \"Gt\", \"In\", \"Lt\", \"NotIn\"", quoted(string(r.Operator)))
		}
	}
	for i, r := range t.MatchFields {
		if ps.full() {
			return
		}
		p := path.Child("matchFields").Index(i)
		if r.Key != "metadata.name" {
			ps.add(p.Child("key"), "unsupported value %s: supported values: \"metadata.name\"", quoted(r.Key))
		}
		if r.Operator != corev1.NodeSelectorOpIn && r.Operator != corev1.NodeSelectorOpNotIn {
			ps.add(p.Child("operator"), "unsupported value %s: supported values: \"In\", \"NotIn\"", quoted(string(r.Operator)))
		}
		if len(r.Values) != 1 {
			ps.add(p.Child("values"), "must have one element")
		}
	}
}

// podAffinityTerm holds a pod affinity term to the API server's rules: a
// topology key, and label selectors that parse.
func podAffinityTerm(path *field.Path, t *corev1.PodAffinityTerm, ps *problems) {
	if t.TopologyKey == "" {
		ps.add(path.Child("topologyKey"), "can not be empty")
	} else {
		ps.addList(metav1validation.ValidateLabelName(t.TopologyKey, path.Child("topologyKey")))
	}
	opts := metav1validation.LabelSelectorValidationOptions{}
	ps.addList(metav1validation.ValidateLabelSelector(t.LabelSelector, opts, path.Child("labelSelector")))
	ps.addList(metav1validation.ValidateLabelSelector(t.NamespaceSelector, opts, path.Child("namespaceSelector")))
	for i, ns := range t.Namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			ps.add(path.Child("namespaces").Index(i), "%s: %s", quoted(ns), strings.Join(errs, "; "))
		}
	}
}

// kubeRaySpec runs KubeRay's spec validator and, when it fails, finds the
// group it fails on: the spec without its worker groups, then with each
// one alone.
func kubeRaySpec(rc *rayv1.RayCluster, ps *problems) {
	spec := field.NewPath("spec")
	err := utils.ValidateRayClusterSpec(&rc.Spec, rc.Annotations)
	if err == nil {
		return
	}
	alone := rc.Spec
	alone.WorkerGroupSpecs = nil
	if headErr := utils.ValidateRayClusterSpec(&alone, rc.Annotations); headErr != nil {
		ps.add(spec, "%s", headErr.Error())
		return
	}
	found := false
	for i := range rc.Spec.WorkerGroupSpecs {
		if ps.full() {
			return
		}
		alone.WorkerGroupSpecs = rc.Spec.WorkerGroupSpecs[i : i+1]
		if gErr := utils.ValidateRayClusterSpec(&alone, rc.Annotations); gErr != nil {
			ps.add(spec.Child("workerGroupSpecs").Index(i), "%s", gErr.Error())
			found = true
		}
	}
	if !found {
		ps.add(spec, "%s", err.Error())
	}
}

// groupNames: each worker group's name is a DNS-1123 label (it is a label
// value and part of its pods' names), its own, and not the head's.
func groupNames(rc *rayv1.RayCluster, ps *problems) {
	seen := map[string]bool{headGroup: true}
	for i := range rc.Spec.WorkerGroupSpecs {
		name := rc.Spec.WorkerGroupSpecs[i].GroupName
		path := field.NewPath("spec", "workerGroupSpecs").Index(i).Child("groupName")
		switch {
		case name == headGroup:
			ps.add(path, "worker group name %q is reserved for the head group", name)
		case seen[name]:
			ps.add(path, "worker group name %s is used twice: each group needs its own name", quoted(name))
		default:
			if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
				ps.add(path, "%s is not a DNS-1123 label: %s", quoted(name), strings.Join(errs, "; "))
			}
		}
		seen[name] = true
		if ps.full() {
			return
		}
	}
}

// validateGroupNames is the first problem of the worker groups' names.
func validateGroupNames(rc *rayv1.RayCluster) error {
	var ps problems
	groupNames(rc, &ps)
	if len(ps.list) == 0 {
		return nil
	}
	return errors.New(ps.list[0])
}

// replicaBounds: counts are not negative and minReplicas ≤ maxReplicas.
func replicaBounds(rc *rayv1.RayCluster, ps *problems) {
	for i := range rc.Spec.WorkerGroupSpecs {
		g := &rc.Spec.WorkerGroupSpecs[i]
		path := field.NewPath("spec", "workerGroupSpecs").Index(i)
		for _, c := range []struct {
			name string
			n    *int32
		}{{"replicas", g.Replicas}, {"minReplicas", g.MinReplicas}, {"maxReplicas", g.MaxReplicas}} {
			if c.n != nil && *c.n < 0 {
				ps.add(path.Child(c.name), "%d is negative", *c.n)
			}
		}
		if lo, hi := ptr.Deref(g.MinReplicas, 0), ptr.Deref(g.MaxReplicas, math.MaxInt32); lo > hi {
			ps.add(path.Child("minReplicas"), "%d is more than maxReplicas (%d)", lo, hi)
		}
		if ps.full() {
			return
		}
	}
}

// serviceNames: the Services KubeRay names after the cluster (the head
// Service, or the name spec.headGroupSpec.headService gives it, and with a
// multi-host group the headless worker Service) have valid names.
func serviceNames(rc *rayv1.RayCluster, ps *problems) {
	head, _ := utils.GenerateHeadServiceName(utils.RayClusterCRD, rc.Spec, rc.Name)
	path := field.NewPath("metadata", "name")
	if hs := rc.Spec.HeadGroupSpec.HeadService; hs != nil && hs.Name != "" {
		path = field.NewPath("spec", "headGroupSpec", "headService", "metadata", "name")
	}
	if errs := validation.IsDNS1035Label(head); len(errs) > 0 {
		ps.add(path, "the head Service's name %s (%d characters) is not a DNS-1035 label: %s", quoted(head), len(head), strings.Join(errs, "; "))
	}
	for _, g := range rc.Spec.WorkerGroupSpecs {
		if g.NumOfHosts > 1 {
			headless := rc.Name + "-" + utils.HeadlessServiceSuffix
			if errs := validation.IsDNS1035Label(headless); len(errs) > 0 {
				ps.add(field.NewPath("metadata", "name"), "the headless worker Service's name %s (%d characters) is not a DNS-1035 label: %s", quoted(headless), len(headless), strings.Join(errs, "; "))
			}
			return
		}
	}
}

// templateMeta: the metadata the CRD does not check (the pod templates',
// the head Service's) is what a pod or Service may carry: labels,
// annotations and the head pod's name (KubeRay keeps a name the head's
// template sets).
func templateMeta(rc *rayv1.RayCluster, ps *problems) {
	check := func(path *field.Path, m *metav1.ObjectMeta) {
		ps.addList(metav1validation.ValidateLabels(m.Labels, path.Child("labels")))
		ps.addList(apivalidation.ValidateAnnotations(m.Annotations, path.Child("annotations")))
	}
	head := field.NewPath("spec", "headGroupSpec")
	check(head.Child("template", "metadata"), &rc.Spec.HeadGroupSpec.Template.ObjectMeta)
	if name := rc.Spec.HeadGroupSpec.Template.Name; name != "" {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			ps.add(head.Child("template", "metadata", "name"), "%s is not a valid pod name: %s", quoted(name), strings.Join(errs, "; "))
		}
	}
	if hs := rc.Spec.HeadGroupSpec.HeadService; hs != nil {
		check(head.Child("headService", "metadata"), &hs.ObjectMeta)
	}
	ps.addList(apivalidation.ValidateAnnotations(rc.Spec.HeadServiceAnnotations, field.NewPath("spec", "headServiceAnnotations")))
	for i := range rc.Spec.WorkerGroupSpecs {
		if ps.full() {
			return
		}
		check(field.NewPath("spec", "workerGroupSpecs").Index(i).Child("template", "metadata"), &rc.Spec.WorkerGroupSpecs[i].Template.ObjectMeta)
	}
}

// podLimit says why a cluster asking for more pods than the manager's
// --max-workload-pods (0: its default) is held ("" when it is not): the
// head and every worker group's replicas × numOfHosts, in 64 bits. A
// suspended cluster asks for none.
func podLimit(rc *rayv1.RayCluster, limit int) string {
	if rc.Spec.Suspend != nil && *rc.Spec.Suspend {
		return ""
	}
	if limit <= 0 {
		limit = manager.DefaultMaxWorkloadPods
	}
	most := min(int64(limit), math.MaxInt32)
	total, biggest := int64(1), -1
	for i := range rc.Spec.WorkerGroupSpecs {
		n := groupPods(&rc.Spec.WorkerGroupSpecs[i])
		total = add(total, n)
		if biggest < 0 || n > groupPods(&rc.Spec.WorkerGroupSpecs[biggest]) {
			biggest = i
		}
	}
	if total <= most {
		return ""
	}
	asked := fmt.Sprintf("%d", total)
	if total == countCap {
		asked = "more than " + asked
	}
	g := &rc.Spec.WorkerGroupSpecs[biggest]
	return fmt.Sprintf("spec.workerGroupSpecs: the cluster asks for %s pods (the head and each group's replicas × numOfHosts; the most, spec.workerGroupSpecs[%d] (group %s): %d replicas × %d hosts), more than the %d pods one RayCluster may have (the manager's --max-workload-pods): no pod is created until it asks for at most %d (the pods it no longer asks for, as workersToDelete, are still deleted)",
		asked, biggest, quoted(g.GroupName), groupPods(g)/hosts(g), hosts(g), most, most)
}
