package inventory

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

func gpuNode(name, product string, gpus int, unhealthy ...int) *gpuv1alpha1.GPUNode {
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for i := range gpus {
		g := gpuv1alpha1.GPU{Index: int32(i), Product: product, Health: gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUHealthy}}
		for _, u := range unhealthy {
			if u == i {
				g.Health.State = gpuv1alpha1.GPUUnhealthy
			}
		}
		gn.Status.GPUs = append(gn.Status.GPUs, g)
	}
	Summarize(&gn.Status)
	return gn
}

func pod(uid, node string, gpus int64, phase corev1.PodPhase) *corev1.Pod {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{GPUResource: q}},
		}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

const h100 = "NVIDIA H100 80GB HBM3"

// kubeNode is a Ready Node advertising res (name, count, name, count, …)
// as capacity and allocatable.
func kubeNode(name string, res ...any) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	n.Status.Allocatable, n.Status.Capacity = corev1.ResourceList{}, corev1.ResourceList{}
	for i := 0; i+1 < len(res); i += 2 {
		q := *resource.NewQuantity(int64(res[i+1].(int)), resource.DecimalSI)
		n.Status.Allocatable[corev1.ResourceName(res[i].(string))] = q
		n.Status.Capacity[corev1.ResourceName(res[i].(string))] = q
	}
	return n
}

// addGPUNode records a Node advertising gpus nvidia.com/gpu and its
// GPUNode.
func addGPUNode(x *Index, name, product string, gpus int, unhealthy ...int) {
	x.SetNode(kubeNode(name, "nvidia.com/gpu", gpus))
	x.SetGPUNode(gpuNode(name, product, gpus, unhealthy...))
}

// 4 H100 nodes: 3 with 8 free, 1 with 4 free; 1 A100 node.
func fleet() *Index {
	x := NewIndex()
	for i := range 4 {
		addGPUNode(x, fmt.Sprintf("h%d", i), h100, 8)
	}
	addGPUNode(x, "a0", "NVIDIA A100-SXM4-40GB", 8)
	x.SetPod(pod("p1", "h3", 4, corev1.PodRunning))
	x.SetPod(pod("done", "h2", 8, corev1.PodSucceeded)) // finished: holds nothing
	x.SetPod(pod("pending", "", 8, corev1.PodPending))  // unbound: holds nothing
	return x
}

func TestFits(t *testing.T) {
	x := fleet()
	tests := []struct {
		name     string
		gang     Gang
		verdict  Verdict
		msg, now string
	}{
		{"fits now", Gang{Groups: []PodGroup{{Count: 3, GPUs: 8}}, Product: "NVIDIA-H100-80GB-HBM3"}, FitsNow,
			"fits what is free now: needs 3 pods × 8 nvidia.com/gpu of NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu: 28 free on 4 nodes, 32 in the cluster"},
		{"uses the half-free node", Gang{Groups: []PodGroup{{Count: 3, GPUs: 8}, {Count: 2, GPUs: 2}}, Product: "NVIDIA-H100-80GB-HBM3"}, FitsNow, "", ""},
		{"not now", Gang{Groups: []PodGroup{{Count: 4, GPUs: 8}}, Product: "NVIDIA-H100-80GB-HBM3"}, NotNow,
			"needs 4 pods × 8 nvidia.com/gpu of NVIDIA-H100-80GB-HBM3 (32 in all): it fits the cluster once GPUs free up",
			"nvidia.com/gpu: 28 free on 4 nodes, 32 in the cluster; 3 nodes have 8 free, 1 has 4"},
		{"larger than the cluster: fits once nodes are added", Gang{Groups: []PodGroup{{Count: 5, GPUs: 8}}, Product: "NVIDIA-H100-80GB-HBM3"},
			NotNow, "needs 5 pods × 8 nvidia.com/gpu of NVIDIA-H100-80GB-HBM3 (40 in all): needs 8 more GPUs than the cluster has (32 on 4 nodes) " +
				"(1 more node with nvidia.com/gpu is ruled out by the pods' node selector, affinity or tolerations); it fits once nodes are added", "28 free"},
		{"does not divide into the nodes: fits once nodes are added", Gang{Groups: []PodGroup{{Count: 6, GPUs: 5}}, Product: "NVIDIA-H100-80GB-HBM3"},
			NotNow, "the cluster's 32 GPUs on 4 nodes do not divide into the gang's pods", ""},
		{"never: one pod too big among pods that fit", Gang{Groups: []PodGroup{{Count: 1, GPUs: 16}, {Count: 2, GPUs: 1}}},
			Never, "none with more than 8: a pod is bigger than any node it may go to, it can never fit", "36 free on 5 nodes"},
		{"never: too big per pod", Gang{Groups: []PodGroup{{Count: 1, GPUs: 16}}},
			Never, "none with more than 8", ""},
		{"never: absent product", Gang{Groups: []PodGroup{{Count: 1, GPUs: 1}}, Product: "NVIDIA-B200"},
			Never, "the cluster has no NVIDIA-B200 GPUs (it has NVIDIA-A100-SXM4-40GB: 8, NVIDIA-H100-80GB-HBM3: 32)", ""},
		{"any product", Gang{Groups: []PodGroup{{Count: 4, GPUs: 8}}}, FitsNow, "", ""},
		{"no GPUs", Gang{Groups: []PodGroup{{Count: 3, GPUs: 0}}}, FitsNow, "needs no GPUs", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := x.Fits(tt.gang)
			if r.Verdict != tt.verdict || !strings.Contains(r.Message, tt.msg) || !strings.Contains(r.Now, tt.now) {
				t.Errorf("Fits = %s %q (now %q), want %s containing %q (now %q)", r.Verdict, r.Message, r.Now, tt.verdict, tt.msg, tt.now)
			}
			if strings.Contains(r.Message, "free on") || strings.Contains(r.Message, " have ") {
				t.Errorf("the message carries live numbers: %q", r.Message)
			}
		})
	}
}

// A waiting gang's message is the same whatever else is allocated or freed
// while its verdict holds (the live numbers move in Now, Free), and says
// apart waiting for GPUs, waiting for nodes that take no pods now, needing
// more nodes and never fitting.
func TestFitsMessageIgnoresChurn(t *testing.T) {
	gang := Gang{Groups: []PodGroup{{Count: 2, GPUs: 8}}}
	x := NewIndex()
	for i := range 4 {
		addGPUNode(x, fmt.Sprintf("n%d", i), h100, 8)
	}
	busy := func(pods ...int64) {
		for i := range 4 {
			x.DeletePod(types.UID(fmt.Sprintf("b%d", i)))
		}
		for i, n := range pods {
			x.SetPod(pod(fmt.Sprintf("b%d", i), fmt.Sprintf("n%d", i), n, corev1.PodRunning))
		}
	}
	busy(8, 8, 8, 1)
	want := x.Fits(gang)
	if want.Verdict != NotNow || want.Units != 16 || want.Free != 7 {
		t.Fatalf("Fits = %+v, want NotNow, 16 units, 7 free", want)
	}
	for _, pods := range [][]int64{{8, 8, 8, 4}, {8, 8, 2, 2}, {8, 8, 8, 8}, {1, 8, 8, 8}, {8, 4, 8, 8}} {
		busy(pods...)
		got := x.Fits(gang)
		if got.Verdict != NotNow || got.Message != want.Message {
			t.Errorf("busy %v: %s %q, want the message %q", pods, got.Verdict, got.Message, want.Message)
		}
		if got.Now == want.Now && got.Free != want.Free {
			t.Errorf("busy %v: Now %q did not follow the free GPUs (%d)", pods, got.Now, got.Free)
		}
	}
	busy(8, 8)
	if got := x.Fits(gang); got.Verdict != FitsNow || got.Message == want.Message {
		t.Errorf("two nodes free: %s %q, want a new verdict", got.Verdict, got.Message)
	}
	busy()
	for _, n := range []string{"n1", "n2", "n3"} { // a drain: one node is left to take pods, too few for the gang
		x.SetNode(func() *corev1.Node { k := kubeNode(n, "nvidia.com/gpu", 8); k.Spec.Unschedulable = true; return k }())
	}
	back := x.Fits(gang)
	if back.Verdict != NotNow || back.Message == want.Message || !strings.Contains(back.Message, "once nodes that take no pods now are back") ||
		!strings.Contains(back.Now, "24 more on 3 cordoned nodes") {
		t.Errorf("only cordoned nodes free: %s %q (now %q), want its own verdict", back.Verdict, back.Message, back.Now)
	}
	big := x.Fits(Gang{Groups: []PodGroup{{Count: 5, GPUs: 8}}})
	never := x.Fits(Gang{Groups: []PodGroup{{Count: 1, GPUs: 9}}})
	if big.Verdict != NotNow || !strings.Contains(big.Message, "it fits once nodes are added") || never.Verdict != Never ||
		strings.Contains(never.Message, "not taking pods") {
		t.Errorf("more than the cluster: %s %q; too big a pod: %s %q", big.Verdict, big.Message, never.Verdict, never.Message)
	}
}

func TestIndexUpdatesIncrementally(t *testing.T) {
	x := fleet()
	want := func(product string, nodes, total, free int64) {
		t.Helper()
		for _, s := range x.Summary() {
			if s.Product == product {
				if s.Nodes != nodes || s.Total != total || s.Free != free {
					t.Fatalf("%s = %+v, want nodes %d total %d free %d", product, s, nodes, total, free)
				}
				return
			}
		}
		if nodes != 0 {
			t.Fatalf("%s missing from %+v", product, x.Summary())
		}
	}
	p := "NVIDIA-H100-80GB-HBM3"
	want(p, 4, 32, 28)
	x.SetPod(pod("p1", "h3", 4, corev1.PodSucceeded)) // finishes
	want(p, 4, 32, 32)
	x.SetPod(pod("p2", "h0", 8, corev1.PodRunning))
	x.SetPod(pod("p2", "h0", 8, corev1.PodRunning)) // same again: no double count
	want(p, 4, 32, 24)
	x.SetGPUNode(gpuNode("h1", h100, 8, 3, 5)) // two GPUs fail
	want(p, 4, 30, 22)
	x.DeleteNode("h1")
	want(p, 3, 24, 16)
	x.DeletePod("p2")
	want(p, 3, 24, 24)
	if c, f := x.NodeFree("h0"); c != 8 || f != 8 {
		t.Fatalf("h0 = %d/%d", c, f)
	}
	// A pod on a node whose GPUNode comes later is counted when it comes.
	x.SetPod(pod("early", "late", 2, corev1.PodRunning))
	addGPUNode(x, "late", h100, 8)
	want(p, 4, 32, 30)
	// Overcommitted node (more requested than healthy): free is 0, not negative.
	x.SetPod(pod("big", "late", 8, corev1.PodRunning))
	want(p, 4, 32, 24)
}

// Random operations leave the incremental index equal to one rebuilt from
// scratch, and the packing never contradicts brute force.
func TestIndexMatchesRebuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := NewIndex()
	nodes := map[string]*gpuv1alpha1.GPUNode{}
	kube := map[string]*corev1.Node{}
	pods := map[string]*corev1.Pod{}
	for range 5000 {
		switch rng.IntN(5) {
		case 0:
			n := fmt.Sprintf("n%d", rng.IntN(20))
			gn := gpuNode(n, []string{h100, "B"}[rng.IntN(2)], rng.IntN(9), rng.IntN(10))
			nodes[n] = gn
			x.SetGPUNode(gn)
			kube[n] = kubeNode(n, "nvidia.com/gpu", len(gn.Status.GPUs))
			x.SetNode(kube[n])
		case 1:
			n := fmt.Sprintf("n%d", rng.IntN(20))
			delete(nodes, n)
			x.DeleteGPUNode(n)
		case 2, 3:
			uid := fmt.Sprintf("p%d", rng.IntN(60))
			p := pod(uid, fmt.Sprintf("n%d", rng.IntN(22)), int64(rng.IntN(5)), []corev1.PodPhase{corev1.PodRunning, corev1.PodSucceeded}[rng.IntN(2)])
			pods[uid] = p
			x.SetPod(p)
		case 4:
			uid := fmt.Sprintf("p%d", rng.IntN(60))
			delete(pods, uid)
			x.DeletePod(types.UID(uid))
		}
	}
	y := NewIndex()
	for _, p := range pods {
		y.SetPod(p)
	}
	for _, gn := range nodes {
		y.SetGPUNode(gn)
	}
	for _, n := range kube {
		y.SetNode(n)
	}
	if a, b := fmt.Sprint(x.Summary()), fmt.Sprint(y.Summary()); a != b {
		t.Fatalf("incremental %s != rebuilt %s", a, b)
	}
	for range 200 {
		g := Gang{Groups: []PodGroup{{Count: int64(rng.IntN(6)), GPUs: int64(1 + rng.IntN(8))}, {Count: int64(rng.IntN(3)), GPUs: int64(1 + rng.IntN(3))}}}
		if x.Fits(g).Verdict != y.Fits(g).Verdict {
			t.Fatalf("verdicts differ for %+v", g)
		}
	}
}

func TestPackMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		var free []int64
		hist := map[int64]int64{}
		for range 1 + rng.IntN(4) {
			f := int64(rng.IntN(9))
			free = append(free, f)
			hist[f]++
		}
		groups := []PodGroup{{Count: int64(rng.IntN(4)), GPUs: int64(1 + rng.IntN(8))}, {Count: int64(rng.IntN(3)), GPUs: int64(1 + rng.IntN(4))}}
		if groups[1].GPUs > groups[0].GPUs {
			groups[0], groups[1] = groups[1], groups[0]
		}
		var sizes []int64
		for _, g := range groups {
			for range g.Count {
				sizes = append(sizes, g.GPUs)
			}
		}
		brute := bruteFits(sizes, free)
		if got := pack(groups, hist); got && !brute {
			t.Fatalf("pack placed %v on %v, which brute force cannot", sizes, free)
		} else if !got && brute && !hasTwoDistinct(groups) {
			t.Fatalf("pack failed %v on %v, brute force fits", sizes, free)
		}
	}
}

// Best-fit decreasing is optimal for one pod size; with two sizes it is a
// heuristic, so only a single-size miss is a bug.
func hasTwoDistinct(g []PodGroup) bool {
	return g[0].Count > 0 && g[1].Count > 0 && g[0].GPUs != g[1].GPUs
}

func bruteFits(sizes, free []int64) bool {
	if len(sizes) == 0 {
		return true
	}
	for i := range free {
		if free[i] >= sizes[0] {
			free[i] -= sizes[0]
			ok := bruteFits(sizes[1:], free)
			free[i] += sizes[0]
			if ok {
				return true
			}
		}
	}
	return false
}

func TestIndexConcurrentReaders(t *testing.T) {
	x := fleet()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 500 {
				if i%2 == 0 {
					x.SetPod(pod(fmt.Sprintf("c%d-%d", i, j%20), fmt.Sprintf("h%d", j%4), 1, corev1.PodRunning))
				} else {
					_ = x.Fits(Gang{Groups: []PodGroup{{Count: 2, GPUs: 8}}})
					_ = x.Summary()
				}
			}
		}()
	}
	wg.Wait()
}

func TestPodGPUs(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	gpu := func(n int64) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{GPUResource: *resource.NewQuantity(n, resource.DecimalSI)}}
	}
	spec := corev1.PodSpec{
		Containers:     []corev1.Container{{Resources: gpu(2)}, {Resources: gpu(1)}},
		InitContainers: []corev1.Container{{Resources: gpu(4)}, {Resources: gpu(1), RestartPolicy: &always}},
	}
	if got := PodGPUs(&spec); got != 4 {
		t.Fatalf("PodGPUs = %d, want 4 (init container 4 > 2+1+1 sidecar)", got)
	}
	spec.InitContainers[0].Resources = gpu(3)
	if got := PodGPUs(&spec); got != 4 {
		t.Fatalf("PodGPUs = %d, want 4 (2+1 containers + 1 sidecar)", got)
	}
}

func TestUsesGPUs(t *testing.T) {
	one := resource.MustParse("1")
	renamed := sharing.NamesOf(renamingSource())
	for _, tc := range []struct {
		name string
		spec corev1.PodSpec
		want bool
	}{
		{"no resources", corev1.PodSpec{Containers: []corev1.Container{{}}}, false},
		{"whole GPUs", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{GPUResource: one}}}}}, true},
		{"a MIG device", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"nvidia.com/mig-1g.10gb": one}}}}}, true},
		{"shared replicas", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu.shared": one}}}}}, true},
		{"an init container's", corev1.PodSpec{Containers: []corev1.Container{{}}, InitContainers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{GPUResource: one}}}}}, true},
		{"zero GPUs", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{GPUResource: resource.MustParse("0")}}}}}, false},
		{"another vendor's device", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"example.com/fpga": one}}}}}, false},
		{"another nvidia.com/ device (a NIC)", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/rdma_shared": one}}}}}, false},
		{"a renamed shared GPU", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/small": one}}}}}, true},
	} {
		if got := UsesGPUs(&tc.spec, renamed); got != tc.want {
			t.Errorf("%s: UsesGPUs = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// buildFleet indexes nodes GPU nodes of two products and pods bound pods.
func buildFleet(nodes, pods int) *Index {
	x := NewIndex()
	for i := range nodes {
		product := h100
		if i%5 == 0 {
			product = "NVIDIA A100-SXM4-80GB"
		}
		addGPUNode(x, fmt.Sprintf("node-%d", i), product, 8)
	}
	for i := range pods {
		x.SetPod(pod(fmt.Sprintf("pod-%d", i), fmt.Sprintf("node-%d", i%nodes), int64(i%2), corev1.PodRunning))
	}
	return x
}

// BenchmarkFits5000Nodes50000Pods: query latency of a 512-pod gang on 5,000
// nodes and 50,000 pods, and the index's memory (heap-B/index).
func BenchmarkFits5000Nodes50000Pods(b *testing.B) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := buildFleet(5000, 50000)
	runtime.GC()
	runtime.ReadMemStats(&after)
	gang := Gang{Groups: []PodGroup{{Count: 1, GPUs: 8}, {Count: 511, GPUs: 8}}, Product: "NVIDIA-H100-80GB-HBM3"}
	b.ResetTimer()
	for b.Loop() {
		if r := x.Fits(gang); r.Verdict != FitsNow {
			b.Fatal(r.Message)
		}
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc), "heap-B/index")
	runtime.KeepAlive(x)
}

// BenchmarkSetPod: cost of one incremental pod update at that size.
func BenchmarkSetPod(b *testing.B) {
	x := buildFleet(5000, 50000)
	p := pod("moving", "node-1", 4, corev1.PodRunning)
	i := 0
	for b.Loop() {
		p.Spec.NodeName = fmt.Sprintf("node-%d", i%5000)
		x.SetPod(p)
		i++
	}
}

func TestSubscribeCoalescesChanges(t *testing.T) {
	idx := NewIndex()
	ch := idx.Subscribe()
	for i := range 5 {
		idx.SetNode(kubeNode(fmt.Sprintf("n%d", i), "nvidia.com/gpu", 1))
	}
	select {
	case <-ch:
	default:
		t.Fatal("no notification after changes")
	}
	select {
	case <-ch:
		t.Fatal("five changes gave more than one pending notification")
	default:
	}
}

// A GPUNode counts only while its Node exists, whatever the order the two
// arrive, leave and come back in; the Node's allocatable is what counts,
// less the GPUs the GPUNode reports unhealthy.
func TestIndexCountsOnlyGPUNodesWithANode(t *testing.T) {
	type step struct {
		op, name string
	}
	tests := []struct {
		name  string
		steps []step
		// want is node "n"'s capacity and the H100 product's node and GPU
		// totals after the steps.
		capacity, nodes, total int64
	}{
		{"GPUNode without a Node", []step{{"gpunode", "n"}}, 0, 0, 0},
		{"Node without a GPUNode: its allocatable", []step{{"node", "n"}}, 8, 1, 8},
		{"Node, then GPUNode with an unhealthy GPU", []step{{"node", "n"}, {"gpunode", "n"}}, 7, 1, 7},
		{"GPUNode, then Node", []step{{"gpunode", "n"}, {"node", "n"}}, 7, 1, 7},
		{"Node deleted", []step{{"node", "n"}, {"gpunode", "n"}, {"-node", "n"}}, 0, 0, 0},
		{"Node back", []step{{"node", "n"}, {"gpunode", "n"}, {"-node", "n"}, {"node", "n"}}, 7, 1, 7},
		{"GPUNode deleted, Node stays", []step{{"node", "n"}, {"gpunode", "n"}, {"-gpunode", "n"}}, 8, 1, 8},
		{"another node's Node", []step{{"node", "m"}, {"gpunode", "n"}}, 0, 1, 8},
		{"Node twice, deleted once", []step{{"node", "n"}, {"node", "n"}, {"gpunode", "n"}, {"-node", "n"}}, 0, 0, 0},
		// No device plugin yet: the GPUNode's healthy GPUs, not free.
		{"Node without GPU resources", []step{{"bare", "n"}, {"gpunode", "n"}}, 7, 1, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewIndex()
			x.SetPod(pod("p", "n", 2, corev1.PodRunning)) // a pod's GPUs are used whether or not they count
			for _, s := range tt.steps {
				switch s.op {
				case "node":
					x.SetNode(kubeNode(s.name, "nvidia.com/gpu", 8))
				case "bare":
					x.SetNode(kubeNode(s.name))
				case "-node":
					x.DeleteNode(s.name)
				case "gpunode":
					x.SetGPUNode(gpuNode(s.name, h100, 8, 3))
				case "-gpunode":
					x.DeleteGPUNode(s.name)
				}
			}
			c, f := x.NodeFree("n")
			var nodes, total int64
			for _, p := range x.Summary() {
				nodes, total = nodes+p.Nodes, total+p.Total
			}
			if c != tt.capacity || nodes != tt.nodes || total != tt.total || f != max(tt.capacity-2, 0) {
				t.Errorf("node n %d/%d free, fleet %d nodes %d GPUs; want %d/%d, %d, %d", f, c, nodes, total, max(tt.capacity-2, 0), tt.capacity, tt.nodes, tt.total)
			}
			if r := x.Fits(Gang{Groups: []PodGroup{{Count: 1, GPUs: 1}}}); tt.total == 0 && r.Verdict != Never {
				t.Errorf("an orphan's GPUs fit a pod: %s %s", r.Verdict, r.Message)
			}
		})
	}
}

// Random joins leave the index equal to one rebuilt from the surviving
// Nodes and GPUNodes.
func TestIndexJoinMatchesRebuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	x := NewIndex()
	gpuNodes, nodes := map[string]*gpuv1alpha1.GPUNode{}, map[string]*corev1.Node{}
	for range 3000 {
		n := fmt.Sprintf("n%d", rng.IntN(12))
		switch rng.IntN(4) {
		case 0:
			gn := gpuNode(n, h100, rng.IntN(9), rng.IntN(10))
			gpuNodes[n] = gn
			x.SetGPUNode(gn)
		case 1:
			delete(gpuNodes, n)
			x.DeleteGPUNode(n)
		case 2:
			node := kubeNode(n, "nvidia.com/gpu", rng.IntN(3)*8)
			node.Spec.Unschedulable = rng.IntN(3) == 0
			nodes[n] = node
			x.SetNode(node)
		case 3:
			delete(nodes, n)
			x.DeleteNode(n)
		}
	}
	y := NewIndex()
	for _, gn := range gpuNodes {
		y.SetGPUNode(gn)
	}
	for _, n := range nodes {
		y.SetNode(n)
	}
	if a, b := fmt.Sprint(x.Summary()), fmt.Sprint(y.Summary()); a != b {
		t.Fatalf("incremental %s != rebuilt %s", a, b)
	}
	for range 100 {
		g := Gang{Groups: []PodGroup{{Count: int64(rng.IntN(6)), GPUs: int64(1 + rng.IntN(8))}}}
		if a, b := x.Fits(g), y.Fits(g); a != b {
			t.Fatalf("%+v: incremental %+v, rebuilt %+v", g, a, b)
		}
	}
}

// migGPUNode is a GPUNode whose GPUs are in MIG mode with the given
// profiles' devices each (nil: not in MIG mode).
func migGPUNode(name string, gpus [][]string, unhealthy ...int) *gpuv1alpha1.GPUNode {
	gn := gpuNode(name, "NVIDIA A100-SXM4-80GB", len(gpus), unhealthy...)
	for i, profiles := range gpus {
		if profiles == nil {
			continue
		}
		m := &gpuv1alpha1.MIGStatus{Capable: true, CurrentMode: gpuv1alpha1.MIGEnabled}
		for _, p := range profiles {
			m.Devices = append(m.Devices, gpuv1alpha1.MIGDevice{Profile: p})
		}
		gn.Status.GPUs[i].MIG = m
	}
	Summarize(&gn.Status)
	return gn
}

func podOf(uid, node string, res corev1.ResourceName, n int64) *corev1.Pod {
	p := pod(uid, node, 0, corev1.PodRunning)
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: *resource.NewQuantity(n, resource.DecimalSI)}
	return p
}

func group(count, n int64, res corev1.ResourceName, p *Placement) PodGroup {
	return PodGroup{Count: count, GPUs: n, Resource: res, Placement: p}
}

func labelled(n *corev1.Node, kv ...string) *corev1.Node {
	for i := 0; i+1 < len(kv); i += 2 {
		n.Labels[kv[i]] = kv[i+1]
	}
	return n
}

func tainted(n *corev1.Node, key string, effect corev1.TaintEffect) *corev1.Node {
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: "x", Effect: effect})
	return n
}

// Fits from what the scheduler sees: the Nodes' allocatable for every GPU
// resource, less unhealthy GPUs, on the nodes the pods may use.
func TestFitsSchedulerView(t *testing.T) {
	const (
		gpu    = GPUResource
		shared = corev1.ResourceName("nvidia.com/gpu.shared")
		mig1g  = corev1.ResourceName("nvidia.com/mig-1g.10gb")
		mig3g  = corev1.ResourceName("nvidia.com/mig-3g.40gb")
	)
	a100 := "NVIDIA-A100-SXM4-80GB"
	twoSliced := func(x *Index) { // 2 nodes of 8 GPUs × 4 replicas
		for _, n := range []string{"s0", "s1"} {
			x.SetNode(kubeNode(n, "nvidia.com/gpu", 32))
			x.SetGPUNode(gpuNode(n, h100, 8))
		}
	}
	twoWhole := func(mod func(*corev1.Node) *corev1.Node) func(*Index) {
		return func(x *Index) {
			x.SetNode(kubeNode("w0", "nvidia.com/gpu", 8))
			x.SetNode(mod(kubeNode("w1", "nvidia.com/gpu", 8)))
		}
	}
	// Two A100 nodes in MIG mode: per node one GPU as 7 × 1g.10gb and
	// three as 2 × 3g.40gb: 7 mig-1g.10gb and 6 mig-3g.40gb per node.
	migNodes := func(unhealthy ...int) func(*Index) {
		return func(x *Index) {
			for _, n := range []string{"m0", "m1"} {
				x.SetNode(kubeNode(n, "nvidia.com/mig-1g.10gb", 7, "nvidia.com/mig-3g.40gb", 6))
				ones := []string{"1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"}
				threes := []string{"3g.40gb", "3g.40gb"}
				var bad []int
				if n == "m0" {
					bad = unhealthy
				}
				x.SetGPUNode(migGPUNode(n, [][]string{ones, threes, threes, threes}, bad...))
			}
		}
	}
	selectProduct := &Placement{NodeSelector: map[string]string{ProductLabel: a100}}
	affinityH100 := &Placement{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: ProductLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"NVIDIA-H100-80GB-HBM3"}}},
		}}}}}}
	tolerateDedicated := &Placement{Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}}
	tests := []struct {
		name    string
		setup   func(*Index)
		groups  []PodGroup
		verdict Verdict
		msg     string
	}{
		{"time-slicing ×4: 16 on 2 nodes of 4 GPUs × 4", func(x *Index) {
			for _, n := range []string{"t0", "t1"} {
				x.SetNode(kubeNode(n, "nvidia.com/gpu", 16))
				x.SetGPUNode(gpuNode(n, h100, 4))
			}
		}, []PodGroup{group(2, 8, gpu, nil)}, FitsNow, "needs 2 pods × 8 nvidia.com/gpu | nvidia.com/gpu: 32 free on 2 nodes, 32 in the cluster"},
		{"time-slicing ×4: a 32-replica pod per node of 8 GPUs", twoSliced, []PodGroup{group(2, 32, gpu, nil)}, FitsNow, ""},
		{"time-slicing ×4: not a pod over one node's replicas", twoSliced, []PodGroup{group(1, 33, gpu, nil)}, Never, "none with more than 32"},
		{"time-slicing ×4: what pods use is taken", func(x *Index) {
			twoSliced(x)
			x.SetPod(pod("busy", "s0", 20, corev1.PodRunning))
		}, []PodGroup{group(2, 20, gpu, nil)}, NotNow, "it fits the cluster once GPUs free up | nvidia.com/gpu: 44 free on 2 nodes, 64 in the cluster; 1 node has 32 free, 1 has 12"},

		{"MIG mixed profiles fit", migNodes(), []PodGroup{group(12, 1, mig3g, nil), group(2, 7, mig1g, nil)}, FitsNow, "nvidia.com/mig-3g.40gb"},
		{"MIG: not now, named resource", func(x *Index) {
			migNodes()(x)
			x.SetPod(podOf("p", "m0", mig3g, 6))
			x.SetPod(podOf("q", "m1", mig3g, 4))
		}, []PodGroup{group(4, 2, mig3g, nil)}, NotNow, "needs 4 pods × 2 nvidia.com/mig-3g.40gb (8 in all): it fits the cluster once GPUs free up | nvidia.com/mig-3g.40gb: 2 free on 1 node, 12 in the cluster"},
		{"MIG: a profile no node has", migNodes(), []PodGroup{group(1, 1, "nvidia.com/mig-2g.20gb", nil)}, Never,
			"no node offers nvidia.com/mig-2g.20gb (the cluster has nvidia.com/mig-1g.10gb: 14, nvidia.com/mig-3g.40gb: 12)"},
		{"MIG: whole GPUs are not MIG devices", migNodes(), []PodGroup{group(1, 1, gpu, nil)}, Never, "no node offers nvidia.com/gpu"},
		{"MIG: an unhealthy GPU takes its MIG devices", migNodes(1), []PodGroup{group(2, 6, mig3g, nil)}, NotNow,
			"needs 2 more nvidia.com/mig-3g.40gb than the cluster has (10 on 2 nodes)"},
		{"MIG: unhealthy GPU, the profile's count", migNodes(1), []PodGroup{group(1, 5, mig3g, nil)}, FitsNow, "| nvidia.com/mig-3g.40gb: 10 free on 2 nodes, 10 in the cluster"},

		// The device plugin writes a profile's '+' as '.': the 1g.10gb+me
		// devices NVML reports are nvidia.com/mig-1g.10gb.me.
		{"MIG: an unhealthy GPU takes its media-extension devices", func(x *Index) {
			x.SetNode(kubeNode("e0", "nvidia.com/mig-1g.10gb.me", 2))
			x.SetGPUNode(migGPUNode("e0", [][]string{{"1g.10gb+me"}, {"1g.10gb+me"}}, 0))
		}, []PodGroup{group(1, 2, "nvidia.com/mig-1g.10gb.me", nil)}, Never, "none with more than 1"},
		{".shared rename", func(x *Index) { x.SetNode(kubeNode("r0", "nvidia.com/gpu.shared", 32)) },
			[]PodGroup{group(4, 8, shared, nil)}, FitsNow, "needs 4 pods × 8 nvidia.com/gpu.shared | nvidia.com/gpu.shared: 32 free on 1 node"},
		{".shared rename: nvidia.com/gpu is gone", func(x *Index) { x.SetNode(kubeNode("r0", "nvidia.com/gpu.shared", 32)) },
			[]PodGroup{group(1, 1, gpu, nil)}, Never, "no node offers nvidia.com/gpu (the cluster has nvidia.com/gpu.shared: 32)"},
		{".shared rename: an unhealthy GPU takes its replicas", func(x *Index) {
			x.SetNode(kubeNode("r0", "nvidia.com/gpu.shared", 32))
			x.SetGPUNode(gpuNode("r0", h100, 8, 2))
		}, []PodGroup{group(1, 29, shared, nil)}, Never, "none with more than 28"},

		{"cordoned: not free, but counted", twoWhole(func(n *corev1.Node) *corev1.Node { n.Spec.Unschedulable = true; return n }),
			[]PodGroup{group(2, 8, gpu, nil)}, NotNow, "it fits the cluster once nodes that take no pods now are back and GPUs free up | " +
				"nvidia.com/gpu: 8 free on 1 node, 8 in the cluster; 1 node has 8 free; 8 more on 1 cordoned node"},
		{"cordoned: more than the cluster", twoWhole(func(n *corev1.Node) *corev1.Node { n.Spec.Unschedulable = true; return n }),
			[]PodGroup{group(3, 8, gpu, nil)}, NotNow, "needs 8 more GPUs than the cluster has (16 on 2 nodes); it fits once nodes are added | nvidia.com/gpu: 8 free on 1 node, 8 in the cluster; 1 node has 8 free; 8 more on 1 cordoned node"},
		{"NotReady", twoWhole(func(n *corev1.Node) *corev1.Node {
			n.Status.Conditions[0].Status = corev1.ConditionUnknown
			return tainted(n, "node.kubernetes.io/unreachable", corev1.TaintEffectNoExecute)
		}), []PodGroup{group(2, 8, gpu, nil)}, NotNow, "8 more on 1 NotReady node"},
		{"no Ready condition is NotReady", twoWhole(func(n *corev1.Node) *corev1.Node { n.Status.Conditions = nil; return n }),
			[]PodGroup{group(2, 8, gpu, nil)}, NotNow, "8 more on 1 NotReady node"},
		{"tainted, no toleration: ruled out", twoWhole(func(n *corev1.Node) *corev1.Node { return tainted(n, "dedicated", corev1.TaintEffectNoSchedule) }),
			[]PodGroup{group(2, 8, gpu, nil)}, NotNow, "needs 8 more GPUs than the cluster has (8 on 1 node) (1 more node with nvidia.com/gpu is ruled out"},
		{"tainted, tolerated", twoWhole(func(n *corev1.Node) *corev1.Node { return tainted(n, "dedicated", corev1.TaintEffectNoExecute) }),
			[]PodGroup{group(2, 8, gpu, tolerateDedicated)}, FitsNow, ""},
		{"tainted PreferNoSchedule: no matter", twoWhole(func(n *corev1.Node) *corev1.Node { return tainted(n, "dedicated", corev1.TaintEffectPreferNoSchedule) }),
			[]PodGroup{group(2, 8, gpu, nil)}, FitsNow, ""},
		{"tainted unhealthy: it passes", twoWhole(func(n *corev1.Node) *corev1.Node {
			return tainted(n, gpuv1alpha1.TaintUnhealthy, corev1.TaintEffectNoSchedule)
		}),
			[]PodGroup{group(2, 8, gpu, nil)}, NotNow, "8 more on 1 node tainted nvidia.com/gpu.unhealthy"},
		{"every node tainted", func(x *Index) {
			x.SetNode(tainted(kubeNode("d0", "nvidia.com/gpu", 8), "dedicated", corev1.TaintEffectNoSchedule))
		},
			[]PodGroup{group(1, 1, gpu, nil)}, Never, "none of the 1 node with nvidia.com/gpu may take the pods"},

		{"nodeSelector on gpu.product", func(x *Index) {
			x.SetNode(labelled(kubeNode("a0", "nvidia.com/gpu", 8), ProductLabel, a100))
			x.SetNode(kubeNode("h0", "nvidia.com/gpu", 8))
			x.SetGPUNode(gpuNode("h0", h100, 8)) // not labelled yet: its GPUNode's product
		}, []PodGroup{group(2, 8, gpu, selectProduct)}, NotNow, "needs 2 pods × 8 nvidia.com/gpu of NVIDIA-A100-SXM4-80GB (16 in all): needs 8 more GPUs than the cluster has (8 on 1 node)"},
		{"nodeSelector on an absent product", func(x *Index) { x.SetNode(kubeNode("h0", "nvidia.com/gpu", 8)); x.SetGPUNode(gpuNode("h0", h100, 8)) },
			[]PodGroup{group(1, 8, gpu, selectProduct)}, Never, "the cluster has no NVIDIA-A100-SXM4-80GB GPUs (it has NVIDIA-H100-80GB-HBM3: 8)"},
		{"required affinity on gpu.product", func(x *Index) {
			x.SetNode(labelled(kubeNode("a0", "nvidia.com/gpu", 8), ProductLabel, a100))
			x.SetNode(labelled(kubeNode("h0", "nvidia.com/gpu", 8), ProductLabel, "NVIDIA-H100-80GB-HBM3"))
		}, []PodGroup{group(1, 8, gpu, affinityH100), group(1, 8, gpu, selectProduct)}, FitsNow, ""},
		{"two placements share no node twice", func(x *Index) {
			x.SetNode(labelled(kubeNode("a0", "nvidia.com/gpu", 8), ProductLabel, a100))
			x.SetNode(labelled(kubeNode("h0", "nvidia.com/gpu", 8), ProductLabel, "NVIDIA-H100-80GB-HBM3"))
		}, []PodGroup{group(1, 8, gpu, nil), group(1, 8, gpu, selectProduct)}, FitsNow, ""},
		{"two placements, the narrow one's node taken", func(x *Index) {
			x.SetNode(labelled(kubeNode("a0", "nvidia.com/gpu", 8), ProductLabel, a100))
			x.SetNode(labelled(kubeNode("h0", "nvidia.com/gpu", 8), ProductLabel, "NVIDIA-H100-80GB-HBM3"))
		}, []PodGroup{group(2, 8, gpu, selectProduct)}, NotNow, "needs 8 more GPUs than the cluster has (8 on 1 node)"},

		{"unhealthy GPU", func(x *Index) { addGPUNode(x, "u0", h100, 8, 0) }, []PodGroup{group(1, 8, gpu, nil)}, Never, "none with more than 7"},
		{"unhealthy GPU the device plugin reports too: not twice", func(x *Index) {
			n := kubeNode("u0", "nvidia.com/gpu", 16)
			n.Status.Allocatable[gpu] = *resource.NewQuantity(12, resource.DecimalSI) // 4 GPUs × 4, one unhealthy
			x.SetNode(n)
			x.SetGPUNode(gpuNode("u0", h100, 4, 0))
		}, []PodGroup{group(1, 12, gpu, nil)}, FitsNow, "| nvidia.com/gpu: 12 free on 1 node, 12 in the cluster"},
		{"device plugin not registered yet", func(x *Index) {
			x.SetNode(kubeNode("w0", "nvidia.com/gpu", 8))
			x.SetNode(kubeNode("p0"))
			x.SetGPUNode(gpuNode("p0", h100, 8))
		}, []PodGroup{group(2, 8, gpu, nil)}, NotNow, "8 more on 1 node whose device plugin has not registered its GPUs yet"},
		// A device plugin that stops (a driver upgrade, a config or MIG
		// layout change rolls it) leaves its resource in capacity with
		// allocatable 0, then after kubelet's 5-minute grace period both
		// at 0: the node is expected back, as one not registered yet.
		{"device plugin restarting: capacity stays, allocatable 0", func(x *Index) {
			n := kubeNode("p0", "nvidia.com/gpu", 32)
			n.Status.Allocatable[gpu] = *resource.NewQuantity(0, resource.DecimalSI)
			x.SetNode(n)
			x.SetGPUNode(gpuNode("p0", h100, 8))
		}, []PodGroup{group(1, 32, gpu, nil)}, NotNow, "32 more on 1 node whose device plugin has not registered its GPUs yet"},
		{"device plugin gone past kubelet's grace period: capacity 0", func(x *Index) {
			x.SetNode(kubeNode("p0", "nvidia.com/gpu", 0))
			x.SetGPUNode(gpuNode("p0", h100, 8))
		}, []PodGroup{group(1, 8, gpu, nil)}, NotNow, "8 more on 1 node whose device plugin has not registered its GPUs yet"},
		{"MIG device plugin restarting: its profiles stay counted", func(x *Index) {
			n := kubeNode("m0", "nvidia.com/mig-1g.10gb", 7)
			n.Status.Allocatable["nvidia.com/mig-1g.10gb"] = *resource.NewQuantity(0, resource.DecimalSI)
			x.SetNode(n)
		}, []PodGroup{group(1, 7, mig1g, nil)}, NotNow, "7 more on 1 node whose device plugin has not registered its GPUs yet"},
		// A node applying a new MIG layout offers what it will have only
		// once the MIG manager is done: no "never" meanwhile (a gang that
		// asks for the profile being made waits for it), and "never"
		// again once the layout is applied and still lacks it.
		{"MIG layout being applied: a profile no node has yet", func(x *Index) {
			migNodes()(x)
			x.SetNode(labelled(kubeNode("m0", "nvidia.com/mig-1g.10gb", 7, "nvidia.com/mig-3g.40gb", 6), gpuv1alpha1.LabelMIGConfigState, gpuv1alpha1.MIGConfigPending))
		}, []PodGroup{group(1, 1, "nvidia.com/mig-2g.20gb", nil)}, NotNow,
			"no node offers nvidia.com/mig-2g.20gb (the cluster has nvidia.com/mig-1g.10gb: 14, nvidia.com/mig-3g.40gb: 12); 1 node is applying a new MIG layout (nvidia.com/mig.config.state), so it may fit once the layout is applied"},
		{"MIG layout rebooting: a pod bigger than any node now", func(x *Index) {
			migNodes()(x)
			x.SetNode(labelled(kubeNode("m1", "nvidia.com/mig-1g.10gb", 7, "nvidia.com/mig-3g.40gb", 6), gpuv1alpha1.LabelMIGConfigState, gpuv1alpha1.MIGConfigRebooting))
		}, []PodGroup{group(1, 8, mig1g, nil)}, NotNow, "a pod is bigger than any node it may go to now; 1 node is applying a new MIG layout"},
		{"MIG layout applied: never again", func(x *Index) {
			migNodes()(x)
			x.SetNode(labelled(kubeNode("m0", "nvidia.com/mig-1g.10gb", 7, "nvidia.com/mig-3g.40gb", 6), gpuv1alpha1.LabelMIGConfigState, gpuv1alpha1.MIGConfigSuccess))
		}, []PodGroup{group(1, 1, "nvidia.com/mig-2g.20gb", nil)}, Never, "no node offers nvidia.com/mig-2g.20gb"},
		{"MIG layout being applied on a node the pods may not use", func(x *Index) {
			migNodes()(x)
			n := labelled(kubeNode("m0", "nvidia.com/mig-1g.10gb", 7, "nvidia.com/mig-3g.40gb", 6), gpuv1alpha1.LabelMIGConfigState, gpuv1alpha1.MIGConfigPending)
			x.SetNode(tainted(n, "dedicated", corev1.TaintEffectNoSchedule))
		}, []PodGroup{group(1, 1, "nvidia.com/mig-2g.20gb", nil)}, Never, "no node offers nvidia.com/mig-2g.20gb"},
		{"no GPU nodes", func(*Index) {}, []PodGroup{group(1, 1, gpu, nil)}, Never, "the cluster has no GPU nodes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewIndex()
			tt.setup(x)
			r := x.Fits(Gang{Groups: tt.groups})
			// The verdict's words, then the live picture: msg may span both.
			if got := r.Message + " | " + r.Now; r.Verdict != tt.verdict || !strings.Contains(got, tt.msg) {
				t.Errorf("Fits = %s %q, want %s containing %q", r.Verdict, got, tt.verdict, tt.msg)
			}
		})
	}
}

// PodGroups reads every GPU resource of a pod and its placement.
func TestPodGroups(t *testing.T) {
	spec := corev1.PodSpec{NodeSelector: map[string]string{ProductLabel: "X"}, Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("2"), corev1.ResourceCPU: resource.MustParse("4"),
			"nvidia.com/gpu.shared": resource.MustParse("1")}}}}}
	got := PodGroups(3, &spec)
	if len(got) != 2 || got[0].Resource != "nvidia.com/gpu.shared" || got[0].GPUs != 1 || got[1].Resource != "nvidia.com/mig-1g.10gb" ||
		got[1].GPUs != 2 || got[0].Count != 3 || got[0].Placement == nil || got[0].Placement.NodeSelector[ProductLabel] != "X" {
		t.Fatalf("PodGroups = %+v", got)
	}
	if g := PodGroups(3, &corev1.PodSpec{Containers: []corev1.Container{{}}}); g != nil {
		t.Fatalf("no GPUs: %+v", g)
	}
}

// TrimNode keeps what the index reads and drops the rest.
func TestTrimNode(t *testing.T) {
	n := tainted(kubeNode("n", "nvidia.com/gpu", 8, "nvidia.com/mig-1g.10gb", 7, "cpu", 64), "dedicated", corev1.TaintEffectNoSchedule)
	n.Annotations = map[string]string{"big": strings.Repeat("x", 1000)}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"a"}}}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse})
	n.Spec.Unschedulable = true
	o, err := TrimNode(n)
	if err != nil {
		t.Fatal(err)
	}
	got := o.(*corev1.Node)
	if got.Annotations != nil || got.Status.Images != nil || len(got.Status.Allocatable) != 2 || len(got.Status.Capacity) != 2 ||
		len(got.Status.Conditions) != 1 || got.Labels["kubernetes.io/hostname"] != "n" || !got.Spec.Unschedulable || len(got.Spec.Taints) != 1 {
		t.Fatalf("trimmed %+v", got)
	}
	x, y := NewIndex(), NewIndex()
	x.SetNode(n)
	y.SetNode(got)
	if a, b := x.Fits(Gang{Groups: []PodGroup{{Count: 1, GPUs: 8}}}), y.Fits(Gang{Groups: []PodGroup{{Count: 1, GPUs: 8}}}); a != b {
		t.Fatalf("trimmed %v, whole %v", b, a)
	}
	m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{"a": "b"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	if o, _ := TrimNode(m); o.(*metav1.PartialObjectMetadata).Annotations["a"] != "b" || m.ManagedFields != nil {
		t.Fatalf("metadata %+v", o)
	}
}

// bigFleet is 1,000 nodes as a large shared cluster has them: whole-GPU
// H100s, time-sliced A100s, MIG nodes, some cordoned, NotReady or
// dedicated, with pods on them.
func bigFleet() *Index {
	x := NewIndex()
	for i := range 1000 {
		name := fmt.Sprintf("node-%d", i)
		var n *corev1.Node
		switch i % 4 {
		case 0, 1:
			n = labelled(kubeNode(name, "nvidia.com/gpu", 8), ProductLabel, "NVIDIA-H100-80GB-HBM3")
			x.SetGPUNode(gpuNode(name, h100, 8, i%50))
		case 2:
			n = labelled(kubeNode(name, "nvidia.com/gpu", 32), ProductLabel, "NVIDIA-A100-SXM4-80GB")
		default:
			n = labelled(kubeNode(name, "nvidia.com/mig-1g.10gb", 7, "nvidia.com/mig-3g.40gb", 6), ProductLabel, "NVIDIA-A100-SXM4-80GB")
		}
		switch i % 40 {
		case 5:
			n.Spec.Unschedulable = true
		case 9:
			n.Status.Conditions[0].Status = corev1.ConditionFalse
		case 13:
			tainted(n, "dedicated", corev1.TaintEffectNoSchedule)
		}
		x.SetNode(n)
		x.SetPod(pod(fmt.Sprintf("pod-%d", i), name, int64(i%3), corev1.PodRunning))
	}
	return x
}

// BenchmarkFits1000Nodes: a 128-pod gang selecting H100s (master and
// workers, two placements) on 1,000 mixed nodes.
func BenchmarkFits1000Nodes(b *testing.B) {
	x := bigFleet()
	p := &Placement{NodeSelector: map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3"},
		Tolerations: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists}}}
	w := &Placement{NodeSelector: p.NodeSelector, Tolerations: p.Tolerations, Affinity: &corev1.Affinity{}}
	gang := Gang{Groups: []PodGroup{group(1, 8, GPUResource, p), group(127, 4, GPUResource, w)}}
	for b.Loop() {
		if r := x.Fits(gang); r.Verdict != FitsNow {
			b.Fatal(r.Message)
		}
	}
}
