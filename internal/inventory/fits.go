package inventory

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// PodGroup is Count pods asking GPUs units each of one GPU resource.
type PodGroup struct {
	Count int64
	GPUs  int64
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
// GPU resource the pod asks for, each with the pod's placement. A pod
// asking for two GPU resources is checked against each on its own.
func PodGroups(count int64, spec *corev1.PodSpec) []PodGroup {
	res := podResources(spec)
	if len(res) == 0 || count <= 0 {
		return nil
	}
	p := PlacementOf(spec)
	out := make([]PodGroup, len(res))
	for i, r := range res {
		out[i] = PodGroup{Count: count, GPUs: r.n, Resource: r.name, Placement: p}
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

// FitResult is the answer of Fits, with a message a user can act on.
type FitResult struct {
	Verdict Verdict
	Message string
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
// fail. Messages say how much is on such nodes.
func (x *Index) Fits(g Gang) FitResult {
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
	x.mu.RLock()
	defer x.mu.RUnlock()
	var fits []string
	var notNow *FitResult
	for _, name := range names {
		r := x.fitResource(name, byRes[name], places)
		switch {
		case r.Verdict == Never:
			return r
		case r.Verdict == NotNow && notNow == nil:
			notNow = &r
		case r.Verdict == FitsNow:
			fits = append(fits, r.Message)
		}
	}
	if notNow != nil {
		return *notNow
	}
	return FitResult{Verdict: FitsNow, Message: "fits: " + strings.Join(fits, "; ")}
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
		if pg.Resource == "" {
			pg.Resource = GPUResource
		}
		list := out[pg.Resource]
		i := slices.IndexFunc(list, func(o PodGroup) bool {
			return o.GPUs == pg.GPUs && equality.Semantic.DeepEqual(o.Placement, pg.Placement)
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

// maxPlaces is how many distinct placements one query tells apart (one
// bit each).
const maxPlaces = 64

// place is a compiled placement.
type place struct {
	p           *Placement
	product     string // the product it selects, if any (for messages and Gang.Product)
	affinity    *nodeaffinity.RequiredNodeAffinity
	tolerations []corev1.Toleration
	// cordonOK: the pods tolerate node.kubernetes.io/unschedulable, as
	// DaemonSet pods do, so the scheduler places them on cordoned nodes.
	cordonOK bool
}

func compilePlaces(g Gang) ([]place, bool) {
	var out []place
	for _, pg := range g.Groups {
		if slices.ContainsFunc(out, func(p place) bool { return equality.Semantic.DeepEqual(p.p, pg.Placement) }) {
			continue
		}
		if len(out) == maxPlaces {
			return nil, false
		}
		p := place{p: pg.Placement, product: g.Product}
		if pg.Placement != nil {
			if v := pg.Placement.NodeSelector[ProductLabel]; v != "" {
				p.product = v
			}
			a := nodeaffinity.NewRequiredNodeAffinity(pg.Placement.NodeSelector, pg.Placement.Affinity)
			p.affinity, p.tolerations = &a, pg.Placement.Tolerations
			p.cordonOK = corev1helpers.TolerationsTolerateTaint(logr.Discard(), p.tolerations,
				&corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}, true)
		}
		out = append(out, p)
	}
	return out, true
}

func placeIndex(places []place, pl *Placement) int {
	for i := range places {
		if equality.Semantic.DeepEqual(places[i].p, pl) {
			return i
		}
	}
	return -1
}

// Why a node offers nothing free to a placement that may use it.
const (
	closedCordoned = "cordoned"
	closedNotReady = "NotReady"
	closedPending  = "pending"
	closedTaint    = "taint:"
)

// admits says whether the placement may use node n at all, and when it
// may, why it cannot now ("" when it can).
// scratch is a Node of n's name and labels for the affinity helpers to
// match (one per query, not one per node in memory).
func (p *place) admits(n *nodeEntry, scratch *corev1.Node) (ok bool, closed string) {
	if p.product != "" && n.product != p.product {
		return false, ""
	}
	if p.affinity != nil {
		scratch.Name, scratch.Labels = n.name, n.labels
		if m, err := p.affinity.Match(scratch); err != nil || !m {
			return false, ""
		}
	}
	for i := range n.node.taints {
		t := &n.node.taints[i]
		if corev1helpers.TolerationsTolerateTaint(logr.Discard(), p.tolerations, t, true) {
			continue
		}
		if !passingTaint(t.Key) {
			return false, ""
		}
		if closed == "" {
			closed = closedTaint + t.Key
		}
	}
	switch {
	case n.node.cordoned && !p.cordonOK:
		return true, closedCordoned
	case n.node.notReady:
		return true, closedNotReady
	case n.pending:
		return true, closedPending
	}
	return true, closed
}

// passingTaint: a taint that comes and goes with the node's condition
// (kubelet's and the node lifecycle controller's node.kubernetes.io/*,
// Loom's unhealthy-GPU taint), not one that dedicates the node.
func passingTaint(key string) bool {
	return strings.HasPrefix(key, "node.kubernetes.io/") || key == gpuv1alpha1.TaintUnhealthy
}

// tally is one resource's nodes as the gang's placements see them.
type tally struct {
	free, offers map[bucketKey]int64 // (placements' mask, units) → nodes
	full         int64               // open eligible nodes with nothing free
	nodes        int64               // nodes with the resource
	eligible     int64               // nodes some placement may use
	excluded     int64               // nodes with it no placement may use
	open, idle   int64               // open eligible nodes, those with something free
	total, spare int64               // offers and free on open eligible nodes
	all          int64               // offers on every eligible node
	largest      int64               // the largest offer of an eligible node
	closed       map[string][2]int64 // reason → nodes, units
}

func (x *Index) tally(res corev1.ResourceName, places []place) *tally {
	t := &tally{free: map[bucketKey]int64{}, offers: map[bucketKey]int64{}, closed: map[string][2]int64{}}
	scratch := &corev1.Node{}
	for _, n := range x.nodes {
		offer := amount(n.offers, res)
		if offer == 0 {
			continue
		}
		t.nodes++
		var elig, open uint64
		reason := ""
		for i := range places {
			ok, closed := places[i].admits(n, scratch)
			if !ok {
				continue
			}
			elig |= 1 << i
			if closed == "" {
				open |= 1 << i
			} else if reason == "" {
				reason = closed
			}
		}
		t.add(n, res, offer, elig, open, reason)
	}
	return t
}

func (t *tally) add(n *nodeEntry, res corev1.ResourceName, offer int64, elig, open uint64, reason string) {
	if elig == 0 {
		t.excluded++
		return
	}
	t.eligible++
	t.all += offer
	t.largest = max(t.largest, offer)
	t.offers[bucketKey{elig, offer}]++
	if open == 0 {
		c := t.closed[reason]
		t.closed[reason] = [2]int64{c[0] + 1, c[1] + offer}
		return
	}
	free := n.free(res)
	t.open++
	t.total += offer
	t.spare += free
	if free == 0 {
		t.full++
		return
	}
	t.idle++
	t.free[bucketKey{open, free}]++
}

// fitResource answers Fits for one resource's groups.
func (x *Index) fitResource(res corev1.ResourceName, groups []PodGroup, places []place) FitResult {
	var demands []demand
	var units int64
	for _, pg := range groups {
		demands = append(demands, demand{PodGroup: pg, place: placeIndex(places, pg.Placement)})
		units += pg.Count * pg.GPUs
	}
	what := fmt.Sprintf("%s %s", describeGroups(groups), res)
	product := places[demands[0].place].product
	if product != "" && !slices.ContainsFunc(demands, func(d demand) bool { return places[d.place].product != product }) {
		what += " of " + product
	}
	t := x.tally(res, places)
	if t.eligible == 0 {
		return FitResult{Verdict: Never, Message: x.nowhere(what, res, product, t)}
	}
	if packBuckets(demands, t.free) {
		return FitResult{Verdict: FitsNow, Message: fmt.Sprintf("needs %s, %d of %d free", what, units, t.spare)}
	}
	if !packBuckets(demands, t.offers) {
		return t.tooSmall(what, res, units, groups[0].GPUs, demands)
	}
	msg := fmt.Sprintf("needs %s (%d in all), %d free on %s, %d in the cluster", what, units, t.spare, plural(t.idle, "node"), t.total)
	if t.open > 0 {
		hist := map[int64]int64{0: t.full}
		for k, v := range t.free {
			hist[k.n] += v
		}
		msg += "; " + describeHistogram(hist)
	}
	return FitResult{Verdict: NotNow, Message: msg + t.describeClosed()}
}

// tooSmall answers a gang that does not fit even with every eligible node
// free. Never only when some pod is bigger than every node its placement may
// use: then no cluster of such nodes can hold it. A gang each of whose pods
// fits some node, but not all of them together, fits once nodes are added:
// NotNow, saying how many units are missing.
func (t *tally) tooSmall(what string, res corev1.ResourceName, units, biggest int64, demands []demand) FitResult {
	var notes string
	if n := t.eligible - t.open; n > 0 {
		notes += fmt.Sprintf(" (%s of them not taking pods now)", plural(n, "node"))
	}
	if t.excluded > 0 {
		verb := "are"
		if t.excluded == 1 {
			verb = "is"
		}
		notes += fmt.Sprintf(" (%s with %s %s ruled out by the pods' node selector, affinity or tolerations)", plural(t.excluded, "more node"), res, verb)
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
		return FitResult{Verdict: NotNow, Message: msg + notes + "; it fits once nodes are added"}
	}
	msg := fmt.Sprintf("needs %s (%d in all); this cluster has %s with %d %s", what, units, plural(t.eligible, "node"), t.all, unit(res))
	if biggest > t.largest {
		msg += fmt.Sprintf(", none with more than %d", t.largest)
	}
	return FitResult{Verdict: Never, Message: msg + notes + ": a pod is bigger than any node it may go to, it can never fit"}
}

// nowhere says why no node may take the pods.
func (x *Index) nowhere(what string, res corev1.ResourceName, product string, t *tally) string {
	switch {
	case t.nodes == 0 && res == GPUResource && len(x.resourcesLocked()) == 0:
		return fmt.Sprintf("needs %s; the cluster has no GPU nodes", what)
	case t.nodes == 0:
		others := x.resourcesLocked()
		if len(others) == 0 {
			return fmt.Sprintf("needs %s; no node offers %s: the cluster has no GPU nodes", what, res)
		}
		return fmt.Sprintf("needs %s; no node offers %s (the cluster has %s)", what, res, strings.Join(others, ", "))
	}
	if products := x.productsLocked(res); product != "" && products[product] == 0 {
		return fmt.Sprintf("needs %s; the cluster has no %s GPUs (it has %s)", what, product, describeProducts(products))
	}
	return fmt.Sprintf("needs %s; none of the %s with %s may take the pods: their node selector, affinity or tolerations rule %s out",
		what, plural(t.nodes, "node"), res, map[bool]string{true: "it", false: "them all"}[t.nodes == 1])
}

// describeClosed says what is on nodes that take no pods now: "; 8 more on
// 1 cordoned node, 16 on 2 NotReady nodes".
func (t *tally) describeClosed() string {
	reasons := make([]string, 0, len(t.closed))
	for r := range t.closed {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	parts := make([]string, 0, len(reasons))
	for i, r := range reasons {
		c := t.closed[r]
		var where string
		switch r {
		case closedCordoned, closedNotReady:
			where = plural(c[0], r+" node")
		case closedPending:
			where = plural(c[0], "node") + " whose device plugin has not registered its GPUs yet"
		default:
			where = plural(c[0], "node") + " tainted " + strings.TrimPrefix(r, closedTaint)
		}
		more := ""
		if i == 0 {
			more = " more"
		}
		parts = append(parts, fmt.Sprintf("%d%s on %s", c[1], more, where))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; " + strings.Join(parts, ", ")
}

func unit(res corev1.ResourceName) string {
	if res == GPUResource {
		return "GPUs"
	}
	return string(res)
}

func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// resourcesLocked lists every GPU resource the cluster offers with its
// total: "nvidia.com/gpu: 32, nvidia.com/mig-1g.10gb: 14".
func (x *Index) resourcesLocked() []string {
	totals := map[corev1.ResourceName]int64{}
	for _, n := range x.nodes {
		for _, r := range n.offers {
			totals[r.name] += r.n
		}
	}
	out := make([]string, 0, len(totals))
	for name, v := range totals {
		out = append(out, fmt.Sprintf("%s: %d", name, v))
	}
	slices.Sort(out)
	return out
}

// productsLocked is what each product's nodes offer of a resource.
func (x *Index) productsLocked(res corev1.ResourceName) map[string]int64 {
	out := map[string]int64{}
	for _, n := range x.nodes {
		if v := amount(n.offers, res); v > 0 {
			out[n.product] += v
		}
	}
	return out
}

func describeProducts(products map[string]int64) string {
	parts := make([]string, 0, len(products))
	for name, v := range products {
		if name == "" {
			name = "unknown"
		}
		parts = append(parts, fmt.Sprintf("%s: %d", name, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// bucketKey is a set of nodes alike for packing: the placements that may
// use them (one bit each) and the units they have.
type bucketKey struct {
	mask uint64
	n    int64
}

// packBuckets places demands (largest first) onto nodes given as buckets
// of alike nodes, one pod at a time onto the node with the least units
// that holds it and that its placement may use (best fit; among equals,
// the node fewer placements may use). It works on a copy; the cost is
// O(pods × buckets), independent of the number of nodes.
func packBuckets(demands []demand, hist map[bucketKey]int64) bool {
	h := make(map[bucketKey]int64, len(hist))
	keys := make([]bucketKey, 0, len(hist))
	for k, v := range hist {
		if v > 0 && k.n > 0 {
			h[k] = v
			keys = append(keys, k)
		}
	}
	less := func(a, b bucketKey) int {
		if a.n != b.n {
			return cmp.Compare(a.n, b.n)
		}
		if d := bits.OnesCount64(a.mask) - bits.OnesCount64(b.mask); d != 0 {
			return d
		}
		return cmp.Compare(a.mask, b.mask)
	}
	slices.SortFunc(keys, less)
	for _, d := range demands {
		bit := uint64(1) << d.place
		for range d.Count {
			i := sort.Search(len(keys), func(i int) bool { return keys[i].n >= d.GPUs })
			for i < len(keys) && keys[i].mask&bit == 0 {
				i++
			}
			if i == len(keys) {
				return false
			}
			k := keys[i]
			if h[k]--; h[k] == 0 {
				delete(h, k)
				keys = slices.Delete(keys, i, i+1)
			}
			if rest := (bucketKey{k.mask, k.n - d.GPUs}); rest.n > 0 {
				if h[rest] == 0 {
					j, _ := slices.BinarySearchFunc(keys, rest, less)
					keys = slices.Insert(keys, j, rest)
				}
				h[rest]++
			}
		}
	}
	return true
}

// pack is packBuckets for groups that may all use every node, given as a
// histogram units → nodes.
func pack(groups []PodGroup, hist map[int64]int64) bool {
	h := make(map[bucketKey]int64, len(hist))
	for k, v := range hist {
		h[bucketKey{1, k}] = v
	}
	demands := make([]demand, len(groups))
	for i, g := range groups {
		demands[i] = demand{PodGroup: g}
	}
	return packBuckets(demands, h)
}

func describeGroups(groups []PodGroup) string {
	parts := make([]string, len(groups))
	for i, g := range groups {
		unit := "pods"
		if g.Count == 1 {
			unit = "pod"
		}
		parts[i] = fmt.Sprintf("%d %s × %d", g.Count, unit, g.GPUs)
	}
	return strings.Join(parts, " + ")
}

// describeHistogram says how free units are spread over the nodes: "3 nodes
// have 8 free, 1 has 4, 2 have none".
func describeHistogram(h map[int64]int64) string {
	var keys []int64
	for k, v := range h {
		if v > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] > keys[j] })
	var parts []string
	for i, k := range keys {
		if i == 5 {
			parts = append(parts, "…")
			break
		}
		verb, noun := "have", "nodes"
		if h[k] == 1 {
			verb, noun = "has", "node"
		}
		amount := fmt.Sprintf("%d", k)
		if k == 0 {
			amount = "none"
		}
		switch {
		case i == 0 && k > 0:
			parts = append(parts, fmt.Sprintf("%d %s %s %s free", h[k], noun, verb, amount))
		case i == 0:
			parts = append(parts, fmt.Sprintf("%d %s %s none free", h[k], noun, verb))
		default:
			parts = append(parts, fmt.Sprintf("%d %s %s", h[k], verb, amount))
		}
	}
	return strings.Join(parts, ", ")
}
