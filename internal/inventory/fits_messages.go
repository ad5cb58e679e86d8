package inventory

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/loom-dev/loom/internal/sharing"
)

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
	if t.refused > 0 {
		return fmt.Sprintf("needs %s; %s", what, t.refusedNote(res))
	}
	if products := x.productsLocked(res); product != "" && products[product] == 0 {
		return fmt.Sprintf("needs %s; the cluster has no %s GPUs (it has %s)", what, product, describeProducts(products))
	}
	return fmt.Sprintf("needs %s; none of the %s with %s may take the pods: their node selector, affinity or tolerations rule %s out",
		what, plural(t.nodes, "node"), res, map[bool]string{true: "it", false: "them all"}[t.nodes == 1])
}

// refusedNote says which nodes' device plugins give at most one unit of
// res to a container and what to do: "the device plugin of node gpu-1 (and
// 3 more nodes) gives at most 1 nvidia.com/gpu to a container (time-slicing,
// device plugin config "ts" of ConfigMap loom/dp with
// failRequestsGreaterThanOne) and fails a pod asking for more at admission:
// ask for 1 nvidia.com/gpu per container, or set failRequestsGreaterThanOne:
// false".
func (t *tally) refusedNote(res corev1.ResourceName) string {
	nodes := "node " + t.refusedNode
	if t.refused > 1 {
		nodes += fmt.Sprintf(" (and %s)", plural(t.refused-1, "more node"))
	}
	where, fix := t.refusedWhere, fmt.Sprintf("ask for 1 %s per container", res)
	if !strings.HasPrefix(where, string(sharing.StrategyMPS)) {
		where += ", failRequestsGreaterThanOne: true"
		fix += ", or set failRequestsGreaterThanOne: false in that config"
	}
	return fmt.Sprintf("the device plugin of %s gives at most 1 %s to a container (%s) and kubelet fails a pod asking for more at admission: %s",
		nodes, res, where, fix)
}

// live is the picture behind a verdict as it is now, which moves with every
// allocation: "nvidia.com/gpu: 24 free on 3 nodes, 32 in the cluster; 3
// nodes have 8 free, 1 has none; 8 more on 1 cordoned node".
func (t *tally) live(res corev1.ResourceName) string {
	msg := fmt.Sprintf("%s: %d free on %s, %d in the cluster", res, t.spare, plural(t.idle, "node"), t.total)
	if t.open > 0 {
		hist := map[int64]int64{0: t.full}
		for k, v := range t.free {
			hist[k.n] += v
		}
		msg += "; " + describeHistogram(hist)
	}
	return msg + t.describeClosed()
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
