package inventory

import (
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// maxPlaces is how many distinct placements one query tells apart (one
// bit each).
const maxPlaces = 64

// place is a compiled placement of the groups of one resource whose
// containers ask for more than one unit of it (big) or not.
type place struct {
	p           *Placement
	res         corev1.ResourceName
	big         bool
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
		pg = pg.normal()
		if placeIndex(out, pg) >= 0 {
			continue
		}
		if len(out) == maxPlaces {
			return nil, false
		}
		p := place{p: pg.Placement, res: pg.Resource, big: pg.big(), product: g.Product}
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

func placeIndex(places []place, pg PodGroup) int {
	pg = pg.normal()
	for i := range places {
		if places[i].res == pg.Resource && places[i].big == pg.big() && equality.Semantic.DeepEqual(places[i].p, pg.Placement) {
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

// tolerates: the placement's pods tolerate every taint of n that does not
// pass (passingTaint).
func (p *place) tolerates(n *nodeEntry) bool {
	for i := range n.node.taints {
		t := &n.node.taints[i]
		if !passingTaint(t.Key) && !corev1helpers.TolerationsTolerateTaint(logr.Discard(), p.tolerations, t, true) {
			return false
		}
	}
	return true
}

// reshaping: the node's MIG manager is applying a layout
// (nvidia.com/mig.config.state pending, or rebooting to apply it).
func reshaping(labels map[string]string) bool {
	s := labels[gpuv1alpha1.LabelMIGConfigState]
	return s == gpuv1alpha1.MIGConfigPending || s == gpuv1alpha1.MIGConfigRebooting
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
	openOffers   map[bucketKey]int64 // offers of the nodes that take pods now
	full         int64               // open eligible nodes with nothing free
	nodes        int64               // nodes with the resource
	eligible     int64               // nodes some placement may use
	excluded     int64               // nodes with it no placement may use
	open, idle   int64               // open eligible nodes, those with something free
	total, spare int64               // offers and free on open eligible nodes
	all          int64               // offers on every eligible node
	largest      int64               // the largest offer of an eligible node
	closed       map[string][2]int64 // reason → nodes, units
	// reshaping: nodes applying a new MIG layout that the pods' tolerations
	// admit, whatever they offer now: what they will offer (which MIG
	// profiles, whole GPUs, which product label) is not known until the
	// MIG manager is done, so no "never" is said while there are any.
	reshaping int64
	// refused: nodes the pods' placement admits whose device plugin gives
	// at most one unit to a container, which the pods' containers ask more
	// of; refusedNode (the first by name) and refusedWhere name one.
	refused                   int64
	refusedNode, refusedWhere string
}

func (x *Index) tally(res corev1.ResourceName, places []place) *tally {
	t := &tally{free: map[bucketKey]int64{}, offers: map[bucketKey]int64{}, openOffers: map[bucketKey]int64{}, closed: map[string][2]int64{}}
	scratch := &corev1.Node{}
	for _, n := range x.nodes {
		if n.node != nil && reshaping(n.node.labels) && slices.ContainsFunc(places, func(p place) bool { return p.res == res && p.tolerates(n) }) {
			t.reshaping++
		}
		offer := amount(n.offers, res)
		if offer == 0 {
			continue
		}
		t.nodes++
		var elig, open uint64
		reason, refused := "", false
		for i := range places {
			if places[i].res != res {
				continue
			}
			ok, closed := places[i].admits(n, scratch)
			if !ok {
				continue
			}
			if places[i].big && n.refuses(res) {
				refused = true
				continue
			}
			elig |= 1 << i
			if closed == "" {
				open |= 1 << i
			} else if reason == "" {
				reason = closed
			}
		}
		t.add(n, res, offer, elig, open, reason, refused)
	}
	return t
}

func (t *tally) add(n *nodeEntry, res corev1.ResourceName, offer int64, elig, open uint64, reason string, refused bool) {
	if refused {
		t.refused++
		if t.refusedNode == "" || n.name < t.refusedNode {
			t.refusedNode, t.refusedWhere = n.name, n.where
		}
	}
	if elig == 0 {
		if !refused {
			t.excluded++
		}
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
	t.openOffers[bucketKey{open, offer}]++
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
