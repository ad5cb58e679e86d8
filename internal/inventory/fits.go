package inventory

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

// PodGroup is Count pods asking GPUs units each of one GPU resource.
type PodGroup struct {
	Count int64
	GPUs  int64
	// PerContainer is the most one container of a pod asks of it (GPUs
	// when 0): a device plugin that gives at most one unit of a shared
	// resource to a container refuses more.
	PerContainer int64
	// Resource is the GPU resource asked for; empty is nvidia.com/gpu.
	Resource corev1.ResourceName
	// Placement is where the pods may go; nil is any node.
	Placement *Placement
}

// Placement is what of a pod's spec decides which nodes it may go to.
type Placement struct {
	NodeSelector map[string]string
	// Affinity: its required node affinity counts.
	Affinity    *corev1.Affinity
	Tolerations []corev1.Toleration
}

// PlacementOf is a pod spec's placement; nil when it has none.
func PlacementOf(spec *corev1.PodSpec) *Placement {
	if len(spec.NodeSelector) == 0 && len(spec.Tolerations) == 0 &&
		(spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil) {
		return nil
	}
	return &Placement{NodeSelector: spec.NodeSelector, Affinity: spec.Affinity, Tolerations: spec.Tolerations}
}

// PodGroups is count pods of spec as the index sees them: one group per
// nvidia.com/ resource the pod asks for, each with the pod's placement.
// A pod asking for two GPU resources is checked against each on its own;
// Fits leaves out those that are not GPUs (sharing.Names).
func PodGroups(count int64, spec *corev1.PodSpec) []PodGroup {
	res := podResources(spec, func(name string) bool { return strings.HasPrefix(name, sharing.ResourcePrefix) })
	if len(res) == 0 || count <= 0 {
		return nil
	}
	p := PlacementOf(spec)
	out := make([]PodGroup, len(res))
	for i, r := range res {
		out[i] = PodGroup{Count: count, GPUs: r.n, PerContainer: perContainer(spec, r.name), Resource: r.name, Placement: p}
	}
	return out
}

// Gang is a set of pods that must all be placed at once.
type Gang struct {
	Groups []PodGroup
	// Product restricts every group to nodes of one product (label form,
	// as in the nvidia.com/gpu.product node selector); empty means any.
	Product string
}

// Verdict says whether a gang fits.
type Verdict string

const (
	// FitsNow: the gang fits in what is free now.
	FitsNow Verdict = "Fits"
	// NotNow: it would fit the cluster's nodes, but not what is free now;
	// or it is larger than the whole cluster while each of its pods fits
	// some node, so it fits once nodes are added.
	NotNow Verdict = "NotNow"
	// Never: some pod is bigger than every node it may go to (cordoned and
	// NotReady ones included), or no node may take it at all (a product or
	// GPU resource the cluster lacks, a placement that rules every node
	// out): adding nodes like today's never helps.
	Never Verdict = "Never"
)

// FitResult is the answer of Fits: the verdict, in words a user can act
// on, apart from the live numbers behind it.
type FitResult struct {
	Verdict Verdict
	// Message states the verdict (fits what is free now; fits the cluster
	// once GPUs free up, or once nodes that take no pods now are back;
	// fits once nodes are added; never fits) from what the gang asks and
	// what the cluster's nodes offer, never from what is free on them now:
	// it stays the same while GPUs elsewhere are allocated and freed, so a
	// status that carries it is rewritten when the verdict, the gang or
	// the cluster's nodes change, not at every allocation.
	Message string
	// Now is the live picture behind the verdict: what is free now and on
	// how many nodes, how the free GPUs spread, what is on nodes that take
	// no pods now. It moves with every allocation: for metrics, logs and
	// kubectl loom why, never for a status.
	Now string
	// Units is what the gang asks of the resource the verdict is about (the
	// one that does not fit; the first one when all fit), Free what is
	// free of it now on the nodes the gang may use: live, like Now.
	Units, Free int64
}

// Fits packs the gang's pods onto the nodes each group may go to (largest
// first, each onto the node with the least free that still holds it),
// per GPU resource, against what is free now and again against what the
// nodes offer, to tell "not now" from "never".
//
// Which nodes count: a node the pods' node selector or required affinity
// rules out, or with a NoSchedule/NoExecute taint they do not tolerate,
// does not count at all (that only changes when the pods or the node's
// configuration do). A cordoned or NotReady node, one whose device plugin
// has not registered yet, or one tainted by a condition that passes
// (node.kubernetes.io/*, nvidia.com/gpu.unhealthy) offers nothing free
// now, but counts for "never": it is expected back (a drain, a driver
// upgrade, a reboot), and a gang that fits once it is back must wait, not
// fail. Now says how much is on such nodes.
//
// A node whose device plugin gives at most one unit of a shared resource to
// a container (MPS, or time-slicing with failRequestsGreaterThanOne) does
// not count for pods with a container asking for more: kubelet would fail
// them at admission.
func (x *Index) Fits(g Gang) FitResult {
	x.mu.RLock()
	defer x.mu.RUnlock()
	g.Groups = slices.DeleteFunc(slices.Clone(g.Groups), func(pg PodGroup) bool {
		return pg.Resource != "" && !x.names.IsGPU(string(pg.Resource))
	})
	byRes := groupDemands(g.Groups)
	if len(byRes) == 0 {
		return FitResult{Verdict: FitsNow, Message: "needs no GPUs"}
	}
	places, ok := compilePlaces(g)
	if !ok {
		return FitResult{Verdict: FitsNow, Message: fmt.Sprintf("not checked: more than %d distinct pod placements", maxPlaces)}
	}
	names := make([]corev1.ResourceName, 0, len(byRes))
	for name := range byRes {
		names = append(names, name)
	}
	slices.Sort(names)
	var fits, now []string
	var notNow, first *FitResult
	for _, name := range names {
		r := x.fitResource(name, byRes[name], places)
		switch {
		case r.Verdict == Never:
			return r
		case r.Verdict == NotNow && notNow == nil:
			notNow = &r
		case r.Verdict == FitsNow:
			fits, now = append(fits, r.Message), append(now, r.Now)
			if first == nil {
				first = &r
			}
		}
	}
	if notNow != nil {
		return *notNow
	}
	return FitResult{Verdict: FitsNow, Message: "fits what is free now: " + strings.Join(fits, "; "), Now: strings.Join(now, "; "),
		Units: first.Units, Free: first.Free}
}

// demand is a group of pods of one resource and one placement.
type demand struct {
	PodGroup
	place int
}

// groupDemands drops empty groups, defaults the resource and merges groups
// of one size, resource and placement ("4 pods × 8" rather than "1 pod × 8
// + 3 pods × 8"); per resource, largest first.
func groupDemands(groups []PodGroup) map[corev1.ResourceName][]PodGroup {
	out := map[corev1.ResourceName][]PodGroup{}
	for _, pg := range groups {
		if pg.Count <= 0 || pg.GPUs <= 0 {
			continue
		}
		pg = pg.normal()
		list := out[pg.Resource]
		i := slices.IndexFunc(list, func(o PodGroup) bool {
			return o.GPUs == pg.GPUs && o.big() == pg.big() && equality.Semantic.DeepEqual(o.Placement, pg.Placement)
		})
		if i >= 0 {
			list[i].Count += pg.Count
			continue
		}
		out[pg.Resource] = append(list, pg)
	}
	for _, list := range out {
		sort.SliceStable(list, func(i, j int) bool { return list[i].GPUs > list[j].GPUs })
	}
	return out
}

// normal is pg with its defaults: nvidia.com/gpu, PerContainer GPUs.
func (pg PodGroup) normal() PodGroup {
	if pg.Resource == "" {
		pg.Resource = GPUResource
	}
	if pg.PerContainer <= 0 {
		pg.PerContainer = pg.GPUs
	}
	return pg
}

// big: a container of the pods asks for more than one unit.
func (pg PodGroup) big() bool { return pg.normal().PerContainer > 1 }

// fitResource answers Fits for one resource's groups.
func (x *Index) fitResource(res corev1.ResourceName, groups []PodGroup, places []place) FitResult {
	var demands []demand
	var units int64
	for _, pg := range groups {
		demands = append(demands, demand{PodGroup: pg, place: placeIndex(places, pg)})
		units += pg.Count * pg.GPUs
	}
	what := fmt.Sprintf("%s %s", describeGroups(groups), res)
	product := places[demands[0].place].product
	if product != "" && !slices.ContainsFunc(demands, func(d demand) bool { return places[d.place].product != product }) {
		what += " of " + product
	}
	t := x.tally(res, places)
	r := FitResult{Units: units, Free: t.spare}
	switch {
	case t.eligible == 0:
		r.Verdict, r.Message = Never, x.nowhere(what, res, product, t)
		if t.reshaping > 0 {
			r.Verdict, r.Message = NotNow, r.Message+t.reshapingNote()
			r.Now = t.live(res)
		}
		return r
	case packBuckets(demands, t.free):
		r.Verdict, r.Message = FitsNow, "needs "+what
	case !packBuckets(demands, t.offers):
		r.Verdict, r.Message = t.tooSmall(what, res, units, groups[0].GPUs, demands)
	case !packBuckets(demands, t.openOffers):
		// Only with nodes that take no pods now back (a drain, a driver
		// upgrade, a reboot): which ones, and how many, is live.
		r.Verdict, r.Message = NotNow, fmt.Sprintf("needs %s (%d in all): it fits the cluster once nodes that take no pods now are back and GPUs free up", what, units)
	default:
		r.Verdict, r.Message = NotNow, fmt.Sprintf("needs %s (%d in all): it fits the cluster once GPUs free up", what, units)
	}
	r.Now = t.live(res)
	return r
}

// tooSmall answers a gang that does not fit even with every eligible node
// free. Never only when some pod is bigger than every node its placement may
// use: then no cluster of such nodes can hold it. A gang each of whose pods
// fits some node, but not all of them together, fits once nodes are added:
// NotNow, saying how many units are missing. The words come from the nodes
// and what they offer, not from which of them take pods now (that is live).
func (t *tally) tooSmall(what string, res corev1.ResourceName, units, biggest int64, demands []demand) (Verdict, string) {
	var notes string
	if t.excluded > 0 {
		verb := "are"
		if t.excluded == 1 {
			verb = "is"
		}
		notes += fmt.Sprintf(" (%s with %s %s ruled out by the pods' node selector, affinity or tolerations)", plural(t.excluded, "more node"), res, verb)
	}
	if t.refused > 0 {
		notes += "; " + t.refusedNote(res)
	}
	podTooBig := func(d demand) bool {
		return !packBuckets([]demand{{PodGroup: PodGroup{Count: 1, GPUs: d.GPUs}, place: d.place}}, t.offers)
	}
	if !slices.ContainsFunc(demands, podTooBig) {
		msg := fmt.Sprintf("needs %s (%d in all): ", what, units)
		if units > t.all {
			msg += fmt.Sprintf("needs %d more %s than the cluster has (%d on %s)", units-t.all, unit(res), t.all, plural(t.eligible, "node"))
		} else {
			msg += fmt.Sprintf("the cluster's %d %s on %s do not divide into the gang's pods", t.all, unit(res), plural(t.eligible, "node"))
		}
		return NotNow, msg + notes + "; it fits once nodes are added"
	}
	msg := fmt.Sprintf("needs %s (%d in all); this cluster has %s with %d %s", what, units, plural(t.eligible, "node"), t.all, unit(res))
	if biggest > t.largest {
		msg += fmt.Sprintf(", none with more than %d", t.largest)
	}
	if t.reshaping > 0 {
		return NotNow, msg + notes + ": a pod is bigger than any node it may go to now" + t.reshapingNote()
	}
	return Never, msg + notes + ": a pod is bigger than any node it may go to, it can never fit"
}

// reshapingNote says why a gang that no node can hold now is not "never":
// some nodes are applying a new MIG layout, and what they will offer is
// not known yet.
func (t *tally) reshapingNote() string {
	verb := "are"
	if t.reshaping == 1 {
		verb = "is"
	}
	return fmt.Sprintf("; %s %s applying a new MIG layout (%s), so it may fit once the layout is applied",
		plural(t.reshaping, "node"), verb, gpuv1alpha1.LabelMIGConfigState)
}
