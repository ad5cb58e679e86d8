package inventory

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// GPUResource is the extended resource whole GPUs are requested by.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// Index is the manager's in-memory view of GPUs: per node and per product,
// how many exist and how many are free. It is fed incrementally from the
// GPUNode and Pod informers (SetGPUNode, DeleteGPUNode, SetPod, DeletePod)
// and answers Fits without scanning nodes: per product it keeps a histogram
// of free GPUs per node, so a query costs O(pod groups × distinct free
// counts) however many nodes there are. Safe for concurrent use.
//
// Once RequireNodes is called (Feed does, and feeds it the Nodes with
// SetNode and DeleteNode), a GPUNode's GPUs count only while a Node of its
// name exists: a GPUNode without one (made by hand, or left behind) adds no
// phantom GPUs, and counts as soon as its Node appears.
type Index struct {
	mu       sync.RWMutex
	nodes    map[string]*nodeEntry
	pods     map[types.UID]podEntry
	products map[string]*productEntry
	subs     []chan struct{}
	// requireNodes: count a GPUNode only while its Node is in nodeNames.
	requireNodes bool
	nodeNames    map[string]struct{}
	// inventory is every GPUNode's GPUs, counted or not.
	inventory map[string]gpuInventory
}

// gpuInventory is what a GPUNode adds to its node's entry.
type gpuInventory struct {
	product  string
	capacity int64
}

type nodeEntry struct {
	product  string // label form, e.g. NVIDIA-H100-80GB-HBM3; "" until its GPUNode is seen
	capacity int64  // healthy whole GPUs (MIG-mode GPUs are not nvidia.com/gpu)
	used     int64  // requested by bound, non-terminal pods
}

func (n *nodeEntry) free() int64 { return max(n.capacity-n.used, 0) }

type podEntry struct {
	node string
	gpus int64
}

type productEntry struct {
	nodes, total, free int64
	// byFree and byCapacity count the product's nodes by their number of
	// free and of healthy GPUs.
	byFree, byCapacity map[int64]int64
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{nodes: map[string]*nodeEntry{}, pods: map[types.UID]podEntry{}, products: map[string]*productEntry{},
		nodeNames: map[string]struct{}{}, inventory: map[string]gpuInventory{}}
}

// RequireNodes makes the index count a GPUNode's GPUs only while SetNode
// has recorded its Node (and DeleteNode has not removed it since).
func (x *Index) RequireNodes() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.requireNodes {
		return
	}
	x.requireNodes = true
	for name := range x.inventory {
		x.count(name)
	}
}

// SetNode records that a Node exists; its GPUNode, seen before or later,
// counts.
func (x *Index) SetNode(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.nodeNames[name]; ok {
		return
	}
	x.nodeNames[name] = struct{}{}
	x.count(name)
}

// DeleteNode records that a Node is gone: its GPUNode no longer counts
// (until the GPUNode goes too, or the Node comes back).
func (x *Index) DeleteNode(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.nodeNames[name]; !ok {
		return
	}
	delete(x.nodeNames, name)
	x.count(name)
}

// count sets a node's product and capacity from its GPUNode when it counts,
// to none when it does not.
func (x *Index) count(name string) {
	inv, ok := x.inventory[name]
	if _, node := x.nodeNames[name]; x.requireNodes && !node {
		inv, ok = gpuInventory{}, false
	}
	if !ok && x.nodes[name] == nil {
		return // nothing counted, nothing to take back
	}
	x.update(name, func(n *nodeEntry) { n.product, n.capacity = inv.product, inv.capacity })
}

// update applies f to a node's entry, moving the node between the product
// histograms as its product or free count changes.
func (x *Index) update(node string, f func(*nodeEntry)) {
	n := x.nodes[node]
	if n == nil {
		n = &nodeEntry{}
		x.nodes[node] = n
	}
	x.account(n, -1)
	f(n)
	x.account(n, +1)
	if n.product == "" && n.used == 0 && n.capacity == 0 {
		delete(x.nodes, node)
	}
	for _, c := range x.subs {
		select {
		case c <- struct{}{}:
		default: // a change is already pending for this subscriber
		}
	}
}

// Subscribe returns a channel that receives a value after the index has
// changed (free or total GPUs of some node). Changes coalesce: a slow reader
// sees one value for many changes, never a blocked writer.
func (x *Index) Subscribe() <-chan struct{} {
	c := make(chan struct{}, 1)
	x.mu.Lock()
	x.subs = append(x.subs, c)
	x.mu.Unlock()
	return c
}

func (x *Index) account(n *nodeEntry, sign int64) {
	if n.product == "" {
		return
	}
	p := x.products[n.product]
	if p == nil {
		p = &productEntry{byFree: map[int64]int64{}, byCapacity: map[int64]int64{}}
		x.products[n.product] = p
	}
	free := n.free()
	p.nodes += sign
	p.total += sign * n.capacity
	p.free += sign * free
	p.byFree[free] += sign
	if p.byFree[free] == 0 {
		delete(p.byFree, free)
	}
	p.byCapacity[n.capacity] += sign
	if p.byCapacity[n.capacity] == 0 {
		delete(p.byCapacity, n.capacity)
	}
	if p.nodes == 0 {
		delete(x.products, n.product)
	}
}

// SetGPUNode records a node's inventory (add or update).
func (x *Index) SetGPUNode(gn *gpuv1alpha1.GPUNode) {
	var capacity int64
	product := ""
	for _, g := range gn.Status.GPUs {
		if product == "" {
			product = LabelValue(g.Product)
		}
		if g.Health.State == gpuv1alpha1.GPUUnhealthy || (g.MIG != nil && g.MIG.CurrentMode == gpuv1alpha1.MIGEnabled) {
			continue
		}
		capacity++
	}
	if gn.Status.Product == "mixed" {
		product = "mixed"
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.inventory[gn.Name] = gpuInventory{product: product, capacity: capacity}
	x.count(gn.Name)
}

// DeleteGPUNode forgets a node's inventory (its pods stay counted until
// they go).
func (x *Index) DeleteGPUNode(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.inventory, name)
	x.update(name, func(n *nodeEntry) { n.product, n.capacity = "", 0 })
}

// PodGPUs is what a pod takes of nvidia.com/gpu: the larger of its
// containers' total and its largest init container (as the scheduler
// counts), using limits where requests are unset.
func PodGPUs(spec *corev1.PodSpec) int64 {
	get := func(r corev1.ResourceRequirements) int64 {
		if q, ok := r.Requests[GPUResource]; ok {
			return q.Value()
		}
		if q, ok := r.Limits[GPUResource]; ok {
			return q.Value()
		}
		return 0
	}
	var sum, initMax int64
	for i := range spec.Containers {
		sum += get(spec.Containers[i].Resources)
	}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sum += get(c.Resources) // sidecars run alongside
			continue
		}
		initMax = max(initMax, get(c.Resources))
	}
	return max(sum, initMax)
}

// SetPod records a pod (add or update): bound, non-terminal pods hold their
// GPUs on their node.
func (x *Index) SetPod(pod *corev1.Pod) {
	holds := pod.Spec.NodeName != "" && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
	gpus := int64(0)
	if holds {
		gpus = PodGPUs(&pod.Spec)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old, had := x.pods[pod.UID]
	if had && old.node == pod.Spec.NodeName && old.gpus == gpus {
		return
	}
	x.removePod(pod.UID)
	if gpus > 0 {
		x.pods[pod.UID] = podEntry{node: pod.Spec.NodeName, gpus: gpus}
		x.update(pod.Spec.NodeName, func(n *nodeEntry) { n.used += gpus })
	}
}

// DeletePod forgets a pod.
func (x *Index) DeletePod(uid types.UID) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removePod(uid)
}

func (x *Index) removePod(uid types.UID) {
	old, ok := x.pods[uid]
	if !ok {
		return
	}
	delete(x.pods, uid)
	x.update(old.node, func(n *nodeEntry) { n.used -= old.gpus })
}

// ProductSummary is the GPUs of one product.
type ProductSummary struct {
	Product            string
	Nodes, Total, Free int64
}

// Summary lists every product with its node, GPU and free counts, sorted by
// product.
func (x *Index) Summary() []ProductSummary {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]ProductSummary, 0, len(x.products))
	for name, p := range x.products {
		out = append(out, ProductSummary{Product: name, Nodes: p.nodes, Total: p.total, Free: p.free})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Product < out[j].Product })
	return out
}

// NodeFree returns a node's healthy GPUs and free GPUs.
func (x *Index) NodeFree(node string) (capacity, free int64) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if n := x.nodes[node]; n != nil {
		return n.capacity, n.free()
	}
	return 0, 0
}

// PodGroup is Count pods asking GPUs each.
type PodGroup struct {
	Count int64
	GPUs  int64
}

// Gang is a set of pods that must all be placed at once.
type Gang struct {
	Groups []PodGroup
	// Product restricts placement to one product (label form, as in the
	// nvidia.com/gpu.product node selector); empty means any.
	Product string
}

// Verdict says whether a gang fits.
type Verdict string

const (
	// FitsNow: the gang fits in the GPUs free now.
	FitsNow Verdict = "Fits"
	// NotNow: it would fit the cluster's GPUs, but not what is free now.
	NotNow Verdict = "NotNow"
	// Never: it cannot fit this cluster even with every GPU free.
	Never Verdict = "Never"
)

// FitResult is the answer of Fits, with a message a user can act on.
type FitResult struct {
	Verdict Verdict
	Message string
}

// Fits packs the gang's pods onto nodes (largest first, each onto the node
// with the fewest free GPUs that still hold it) against free GPUs, and
// again against all GPUs to tell "not now" from "never".
func (x *Index) Fits(g Gang) FitResult {
	groups := make([]PodGroup, 0, len(g.Groups))
	var pods, gpus int64
	for _, pg := range g.Groups {
		if pg.Count <= 0 || pg.GPUs <= 0 {
			continue
		}
		pods += pg.Count
		gpus += pg.Count * pg.GPUs
		merged := false
		for i := range groups {
			if groups[i].GPUs == pg.GPUs { // one "4 pods × 8" rather than "1 pod × 8 + 3 pods × 8"
				groups[i].Count += pg.Count
				merged = true
			}
		}
		if !merged {
			groups = append(groups, pg)
		}
	}
	if len(groups) == 0 {
		return FitResult{Verdict: FitsNow, Message: "needs no GPUs"}
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].GPUs > groups[j].GPUs })

	x.mu.RLock()
	defer x.mu.RUnlock()
	var candidates []*productEntry
	for name, p := range x.products {
		if g.Product == "" || g.Product == name {
			candidates = append(candidates, p)
		}
	}
	what := fmt.Sprintf("%s nvidia.com/gpu", describeGroups(groups))
	if g.Product != "" {
		what += " of " + g.Product
	}
	if len(candidates) == 0 {
		if g.Product != "" {
			return FitResult{Verdict: Never, Message: fmt.Sprintf("needs %s; the cluster has no %s GPUs (%s)", what, g.Product, x.productsLocked())}
		}
		return FitResult{Verdict: Never, Message: fmt.Sprintf("needs %s; the cluster has no GPU nodes", what)}
	}
	free, capacity := map[int64]int64{}, map[int64]int64{}
	var totalFree, total, nodes int64
	for _, p := range candidates {
		for f, n := range p.byFree {
			free[f] += n
		}
		for c, n := range p.byCapacity {
			capacity[c] += n
		}
		totalFree += p.free
		total += p.total
		nodes += p.nodes
	}
	if pack(groups, free) {
		return FitResult{Verdict: FitsNow, Message: fmt.Sprintf("fits: needs %s, %d of %d free", what, gpus, totalFree)}
	}
	if !pack(groups, capacity) {
		largest := maxKey(capacity)
		msg := fmt.Sprintf("needs %s (%d in all); this cluster has %d nodes with %d GPUs", what, gpus, nodes, total)
		if groups[0].GPUs > largest {
			msg += fmt.Sprintf(", none with more than %d", largest)
		}
		return FitResult{Verdict: Never, Message: msg + ": it can never fit"}
	}
	return FitResult{Verdict: NotNow, Message: fmt.Sprintf("needs %s (%d in all), %d free, %d in the cluster; %s",
		what, gpus, totalFree, total, describeHistogram(free))}
}

// pack places groups (sorted by GPUs, largest first) onto nodes given as a
// histogram free-GPUs → node count, one pod at a time onto the node with the
// fewest free GPUs that holds it (best fit). It works on a copy; the cost is
// O(pods × distinct free counts), independent of the number of nodes.
func pack(groups []PodGroup, hist map[int64]int64) bool {
	h := make(map[int64]int64, len(hist))
	keys := make([]int64, 0, len(hist))
	for k, v := range hist {
		if v > 0 && k > 0 {
			h[k] = v
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	move := func(from, to int64) {
		h[from]--
		if h[from] == 0 {
			delete(h, from)
			i := sort.Search(len(keys), func(i int) bool { return keys[i] >= from })
			keys = append(keys[:i], keys[i+1:]...)
		}
		if to > 0 {
			if h[to] == 0 {
				i := sort.Search(len(keys), func(i int) bool { return keys[i] >= to })
				keys = append(keys, 0)
				copy(keys[i+1:], keys[i:])
				keys[i] = to
			}
			h[to]++
		}
	}
	for _, g := range groups {
		for range g.Count {
			i := sort.Search(len(keys), func(i int) bool { return keys[i] >= g.GPUs })
			if i == len(keys) {
				return false
			}
			move(keys[i], keys[i]-g.GPUs)
		}
	}
	return true
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

// describeHistogram says how free GPUs are spread over the nodes: "3 nodes
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

func maxKey(h map[int64]int64) int64 {
	var m int64
	for k, v := range h {
		if v > 0 && k > m {
			m = k
		}
	}
	return m
}

func (x *Index) productsLocked() string {
	if len(x.products) == 0 {
		return "no GPU nodes at all"
	}
	var parts []string
	for name, p := range x.products {
		parts = append(parts, fmt.Sprintf("%s: %d", name, p.total))
	}
	sort.Strings(parts)
	return "it has " + strings.Join(parts, ", ")
}
