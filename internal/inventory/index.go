package inventory

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

// GPUResource is the extended resource whole GPUs (or their time-sliced
// replicas) are requested by.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// MIGProfileName is a MIG profile as the device plugin's resource names
// write it: a resource name cannot hold a '+', so the 1g.10gb+me profile is
// nvidia.com/mig-1g.10gb.me.
func MIGProfileName(profile string) string { return strings.ReplaceAll(profile, "+", ".") }

// Index is the manager's in-memory view of GPUs as the scheduler sees them:
// per node, what each GPU resource offers (the Node's allocatable, less the
// GPUs its GPUNode reports unhealthy) and what bound, non-terminal pods
// request of it. It is fed incrementally from the Node, GPUNode and Pod
// informers (SetNode, SetGPUNode, SetPod and their deletes); Fits reads
// the per-node aggregates in one pass over the GPU nodes. Safe for
// concurrent use.
//
// A node offers GPUs only while its Node exists: a GPUNode without one
// (made by hand, or left behind) adds no phantom GPUs.
//
// Which resources are GPUs, and which nodes' device plugins give at most
// one unit of a shared resource to a container, follow the ClusterPolicy's
// sharing configs (SetSharing).
type Index struct {
	mu    sync.RWMutex
	nodes map[string]*nodeEntry
	pods  map[types.UID]podEntry
	subs  []chan struct{}
	src   sharing.Source
	names sharing.Names
}

// nodeEntry is one node: what its Node and GPUNode say, what pods use, and
// what it offers (derived from the three by derive).
type nodeEntry struct {
	name string
	node *nodeView   // nil until its Node is seen
	gpus *gpuHealth  // nil until its GPUNode is seen
	used []resAmount // requested by bound, non-terminal pods

	// derived
	product string            // label form: the Node's nvidia.com/gpu.product, else its GPUNode's
	labels  map[string]string // the Node's, with product when it has no product label
	offers  []resAmount       // per resource, healthy units; sorted by name
	// pending: the Node has no allocatable GPU resource (no device plugin
	// yet, or one that stopped), and offers are its capacity, else the
	// GPUNode's healthy whole GPUs.
	pending bool
	// onePerContainer: the resources its device plugin gives at most one
	// unit of to a container (sharing.Node.OnePerContainer), sorted; where
	// names the config and strategy for messages.
	onePerContainer []corev1.ResourceName
	where           string
}

// nodeView is what the index keeps of a Node.
type nodeView struct {
	labels             map[string]string
	taints             []corev1.Taint // NoSchedule and NoExecute only
	cordoned, notReady bool
	resources          []resCapacity // GPU resources only, sorted by name
}

type resCapacity struct {
	name                  corev1.ResourceName
	capacity, allocatable int64
}

// resAmount is a quantity of one resource.
type resAmount struct {
	name corev1.ResourceName
	n    int64
}

// gpuHealth is what a GPUNode adds: the product, and per device kind how
// many exist and how many are unhealthy.
type gpuHealth struct {
	product             string
	whole, badWhole     int64            // GPUs not in MIG mode
	mig, badMIG         map[string]int64 // MIG devices per profile (1g.10gb; MIGProfileName)
	migTotal, badMIGSum int64
}

func (a *gpuHealth) equal(b *gpuHealth) bool {
	return a != nil && b != nil && a.product == b.product && a.whole == b.whole && a.badWhole == b.badWhole &&
		maps.Equal(a.mig, b.mig) && maps.Equal(a.badMIG, b.badMIG)
}

func (v *nodeView) equal(w *nodeView) bool {
	return v != nil && w != nil && v.cordoned == w.cordoned && v.notReady == w.notReady &&
		maps.Equal(v.labels, w.labels) && slices.Equal(v.resources, w.resources) &&
		slices.EqualFunc(v.taints, w.taints, func(a, b corev1.Taint) bool {
			return a.Key == b.Key && a.Value == b.Value && a.Effect == b.Effect
		})
}

func amount(list []resAmount, name corev1.ResourceName) int64 {
	for _, r := range list {
		if r.name == name {
			return r.n
		}
	}
	return 0
}

// free is what the node has left of a resource.
func (n *nodeEntry) free(name corev1.ResourceName) int64 {
	return max(amount(n.offers, name)-amount(n.used, name), 0)
}

type podEntry struct {
	node string
	res  []resAmount
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{nodes: map[string]*nodeEntry{}, pods: map[types.UID]podEntry{}}
}

// SetNode records a Node (add or update): its labels, taints, whether it
// is cordoned or NotReady, and its GPU resources' capacity and allocatable.
func (x *Index) SetNode(node *corev1.Node) {
	x.mu.Lock()
	defer x.mu.Unlock()
	v := viewNode(node, x.names)
	if n := x.nodes[node.Name]; n != nil && n.node.equal(v) {
		return // a heartbeat, or a change the index does not read
	}
	x.update(node.Name, func(n *nodeEntry) { n.node = v })
}

func viewNode(node *corev1.Node, names sharing.Names) *nodeView {
	v := &nodeView{labels: node.Labels, cordoned: node.Spec.Unschedulable, notReady: !NodeReady(node)}
	for _, t := range node.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			v.taints = append(v.taints, t)
		}
	}
	for name, q := range node.Status.Allocatable {
		if names.IsGPU(string(name)) {
			c := node.Status.Capacity[name]
			v.resources = append(v.resources, resCapacity{name: name, allocatable: q.Value(), capacity: max(c.Value(), q.Value())})
		}
	}
	sort.Slice(v.resources, func(i, j int) bool { return v.resources[i].name < v.resources[j].name })
	return v
}

// DeleteNode records that a Node is gone: it offers nothing (its pods and
// GPUNode stay recorded until they go too, or the Node comes back).
func (x *Index) DeleteNode(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if n := x.nodes[name]; n != nil && n.node != nil {
		x.update(name, func(n *nodeEntry) { n.node = nil })
	}
}

// SetGPUNode records a node's NVML inventory (add or update): its product
// and which of its GPUs and MIG devices are unhealthy.
func (x *Index) SetGPUNode(gn *gpuv1alpha1.GPUNode) {
	h := &gpuHealth{}
	for _, g := range gn.Status.GPUs {
		if h.product == "" {
			h.product = LabelValue(g.Product)
		}
		bad := int64(0)
		if g.Health.State == gpuv1alpha1.GPUUnhealthy {
			bad = 1
		}
		if g.MIG == nil || g.MIG.CurrentMode != gpuv1alpha1.MIGEnabled {
			h.whole++
			h.badWhole += bad
			continue
		}
		if h.mig == nil {
			h.mig, h.badMIG = map[string]int64{}, map[string]int64{}
		}
		for _, d := range g.MIG.Devices {
			p := MIGProfileName(d.Profile)
			h.mig[p]++
			h.badMIG[p] += bad
			h.migTotal++
			h.badMIGSum += bad
		}
	}
	if gn.Status.Product == "mixed" {
		h.product = "mixed"
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if n := x.nodes[gn.Name]; n != nil && n.gpus.equal(h) {
		return
	}
	x.update(gn.Name, func(n *nodeEntry) { n.gpus = h })
}

// DeleteGPUNode forgets a node's NVML inventory; its Node's allocatable
// still counts, with no health to subtract.
func (x *Index) DeleteGPUNode(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if n := x.nodes[name]; n != nil && n.gpus != nil {
		x.update(name, func(n *nodeEntry) { n.gpus = nil })
	}
}

// update applies f to a node's entry, derives what it offers again (not
// for a pod's change: pods change only what is used) and tells the
// subscribers.
func (x *Index) update(name string, f func(*nodeEntry)) {
	n := x.nodes[name]
	if n == nil {
		n = &nodeEntry{name: name}
		x.nodes[name] = n
	}
	node, gpus := n.node, n.gpus
	f(n)
	if n.node == nil && n.gpus == nil && len(n.used) == 0 {
		delete(x.nodes, name)
	} else if n.node != node || n.gpus != gpus {
		n.derive(x.src)
	}
	x.notify()
}

// notify tells the subscribers the index changed.
func (x *Index) notify() {
	for _, c := range x.subs {
		select {
		case c <- struct{}{}:
		default: // a change is already pending for this subscriber
		}
	}
}

// derive sets what a node offers per GPU resource: its allocatable, less
// the units of the GPUs its GPUNode reports unhealthy. Kubelet already
// leaves devices the device plugin reports unhealthy out of allocatable
// (they stay in capacity), so the offer is the smaller of allocatable and
// capacity less the unhealthy GPUs' units: a GPU both report is not taken
// off twice, and one only NVML has seen fail is taken off too.
//
// It also sets which of them the node's device plugin gives at most one
// unit of to a container, from the sharing config the node's labels
// choose (src).
func (n *nodeEntry) derive(src sharing.Source) {
	n.offers, n.pending, n.product, n.labels = nil, false, "", nil
	n.onePerContainer, n.where = nil, ""
	if n.gpus != nil {
		n.product = n.gpus.product
	}
	if n.node == nil {
		return
	}
	if p := n.node.labels[ProductLabel]; p != "" {
		n.product = p
	}
	// A device plugin serves when some GPU resource has allocatable
	// units. One that stopped (a driver upgrade, a sharing config or MIG
	// layout change rolls it) leaves its resources in capacity with
	// allocatable 0, and after kubelet's grace period both at 0: like one
	// not registered yet, the node is expected back and offers its
	// capacity (or its GPUNode's healthy whole GPUs) for "never" only.
	serving := slices.ContainsFunc(n.node.resources, func(r resCapacity) bool { return r.allocatable > 0 })
	cfg, cfgErr := sharing.ForNode(src, n.node.labels)
	for _, r := range n.node.resources {
		healthy := r.allocatable
		if !serving {
			healthy = r.capacity
		}
		// A renamed resource loses the units of the devices it is made of.
		backing := corev1.ResourceName(cfg.Backing(string(r.name)))
		if lost := n.gpus.lost(backing, r.capacity); lost > 0 {
			healthy = min(healthy, r.capacity-lost)
		}
		if healthy > 0 {
			n.offers = append(n.offers, resAmount{r.name, healthy})
		}
	}
	if !serving {
		if len(n.offers) == 0 && n.gpus != nil && n.gpus.whole > n.gpus.badWhole {
			n.offers = []resAmount{{GPUResource, n.gpus.whole - n.gpus.badWhole}}
		}
		n.pending = len(n.offers) > 0
	}
	labels := n.node.labels
	if _, ok := labels[ProductLabel]; !ok && n.product != "" {
		// GPU feature discovery's labels come after the GPUNode: a node
		// not labelled yet matches a product selector by its GPUNode.
		labels = maps.Clone(labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[ProductLabel] = n.product
	}
	n.labels = labels
	if cfgErr == nil {
		for _, r := range n.node.resources {
			if strategy, ok := cfg.OnePerContainer(string(r.name)); ok {
				n.onePerContainer = append(n.onePerContainer, r.name)
				n.where = fmt.Sprintf("%s, %s", strategy, cfg.Where(src))
			}
		}
	}
}

// refuses: the node's device plugin gives at most one unit of res to a
// container.
func (n *nodeEntry) refuses(res corev1.ResourceName) bool {
	return slices.Contains(n.onePerContainer, res)
}

// SetSharing records the ClusterPolicy's device plugin configs (src.Data
// being the ConfigMap's, when it names one): which resources are GPUs
// (their renames), and per node, which of them its device plugin gives at
// most one unit of to a container. It says whether the GPU resource names
// changed: then the nodes and pods recorded before must be set again (the
// caller has them), since what of them is a GPU changed.
func (x *Index) SetSharing(src sharing.Source) (namesChanged bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if equality.Semantic.DeepEqual(src, x.src) {
		return false // a policy's status, or another ConfigMap, changed
	}
	names := sharing.NamesOf(src)
	namesChanged = !names.Equal(x.names)
	x.src, x.names = src, names
	for _, n := range x.nodes {
		n.derive(src)
	}
	x.notify()
	return namesChanged
}

// IsGPUResource says whether name is a resource the device plugin
// advertises GPUs under, with the sharing configs SetSharing recorded
// (sharing.Names.IsGPU).
func (x *Index) IsGPUResource(name corev1.ResourceName) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.names.IsGPU(string(name))
}

// lost is how many units of a resource the unhealthy devices behind it
// take away: with time-slicing each device is capacity/devices replicas.
func (h *gpuHealth) lost(name corev1.ResourceName, capacity int64) int64 {
	if h == nil {
		return 0
	}
	var units, bad int64
	profile, mig := sharing.IsMIG(string(name))
	switch {
	case mig:
		units, bad = h.mig[profile], h.badMIG[profile]
	case h.whole > 0:
		units, bad = h.whole, h.badWhole
	default: // MIG's single strategy: MIG devices are nvidia.com/gpu
		units, bad = h.migTotal, h.badMIGSum
	}
	if units == 0 || bad == 0 {
		return 0
	}
	return bad * max(capacity/units, 1)
}

// Subscribe returns a channel that receives a value after the index has
// changed (what some node offers or has free). Changes coalesce: a slow
// reader sees one value for many changes, never a blocked writer.
func (x *Index) Subscribe() <-chan struct{} {
	c := make(chan struct{}, 1)
	x.mu.Lock()
	x.subs = append(x.subs, c)
	x.mu.Unlock()
	return c
}

// SetPod records a pod (add or update): bound, non-terminal pods hold their
// GPU resources on their node.
func (x *Index) SetPod(pod *corev1.Pod) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var res []resAmount
	if pod.Spec.NodeName != "" && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		res = podResources(&pod.Spec, x.names.IsGPU)
	}
	old, had := x.pods[pod.UID]
	if had && old.node == pod.Spec.NodeName && slices.Equal(old.res, res) {
		return
	}
	x.removePod(pod.UID)
	if len(res) > 0 {
		x.pods[pod.UID] = podEntry{node: pod.Spec.NodeName, res: res}
		x.update(pod.Spec.NodeName, func(n *nodeEntry) { n.used = addAmounts(n.used, res, 1) })
	}
}

// addAmounts adds sign × add to list, dropping what reaches zero.
func addAmounts(list, add []resAmount, sign int64) []resAmount {
	for _, a := range add {
		i := slices.IndexFunc(list, func(r resAmount) bool { return r.name == a.name })
		if i < 0 {
			list = append(list, resAmount{a.name, 0})
			i = len(list) - 1
		}
		list[i].n += sign * a.n
		if list[i].n == 0 {
			list = slices.Delete(list, i, i+1)
		}
	}
	return list
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
	x.update(old.node, func(n *nodeEntry) { n.used = addAmounts(n.used, old.res, -1) })
}

// ProductSummary is the nvidia.com/gpu of one product.
type ProductSummary struct {
	Product            string
	Nodes, Total, Free int64
}

// Summary lists every product with its node, nvidia.com/gpu and free
// counts (free on schedulable, Ready nodes), sorted by product.
func (x *Index) Summary() []ProductSummary {
	x.mu.RLock()
	defer x.mu.RUnlock()
	by := map[string]*ProductSummary{}
	for _, n := range x.nodes {
		total := amount(n.offers, GPUResource)
		if total == 0 {
			continue
		}
		s := by[n.product]
		if s == nil {
			s = &ProductSummary{Product: n.product}
			by[n.product] = s
		}
		s.Nodes++
		s.Total += total
		if n.open() {
			s.Free += n.free(GPUResource)
		}
	}
	out := make([]ProductSummary, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Product < out[j].Product })
	return out
}

// open: the node takes new pods (not cordoned, Ready, its device plugin
// registered). Taints are the pods' to tolerate; see Fits.
func (n *nodeEntry) open() bool {
	return n.node != nil && !n.node.cordoned && !n.node.notReady && !n.pending
}

// NodeFree returns what a node offers of nvidia.com/gpu and what of it is
// free.
func (x *Index) NodeFree(node string) (capacity, free int64) {
	return x.NodeResourceFree(node, GPUResource)
}

// NodeResourceFree returns what a node offers of a GPU resource and what
// of it is free.
func (x *Index) NodeResourceFree(node string, name corev1.ResourceName) (capacity, free int64) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if n := x.nodes[node]; n != nil {
		return amount(n.offers, name), n.free(name)
	}
	return 0, 0
}
