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

// 4 H100 nodes: 3 with 8 free, 1 with 4 free; 1 A100 node.
func fleet() *Index {
	x := NewIndex()
	for i := range 4 {
		x.SetGPUNode(gpuNode(fmt.Sprintf("h%d", i), h100, 8))
	}
	x.SetGPUNode(gpuNode("a0", "NVIDIA A100-SXM4-40GB", 8))
	x.SetPod(pod("p1", "h3", 4, corev1.PodRunning))
	x.SetPod(pod("done", "h2", 8, corev1.PodSucceeded)) // finished: holds nothing
	x.SetPod(pod("pending", "", 8, corev1.PodPending))  // unbound: holds nothing
	return x
}

func TestFits(t *testing.T) {
	x := fleet()
	tests := []struct {
		name    string
		gang    Gang
		verdict Verdict
		msg     string
	}{
		{"fits now", Gang{Groups: []PodGroup{{3, 8}}, Product: "NVIDIA-H100-80GB-HBM3"}, FitsNow, "fits"},
		{"uses the half-free node", Gang{Groups: []PodGroup{{3, 8}, {2, 2}}, Product: "NVIDIA-H100-80GB-HBM3"}, FitsNow, ""},
		{"not now", Gang{Groups: []PodGroup{{4, 8}}, Product: "NVIDIA-H100-80GB-HBM3"},
			NotNow, "needs 4 pods × 8 nvidia.com/gpu of NVIDIA-H100-80GB-HBM3 (32 in all), 28 free, 32 in the cluster; 3 nodes have 8 free, 1 has 4"},
		{"never: too many", Gang{Groups: []PodGroup{{5, 8}}, Product: "NVIDIA-H100-80GB-HBM3"},
			Never, "this cluster has 4 nodes with 32 GPUs: it can never fit"},
		{"never: too big per pod", Gang{Groups: []PodGroup{{1, 16}}},
			Never, "none with more than 8"},
		{"never: absent product", Gang{Groups: []PodGroup{{1, 1}}, Product: "NVIDIA-B200"},
			Never, "the cluster has no NVIDIA-B200 GPUs (it has NVIDIA-A100-SXM4-40GB: 8, NVIDIA-H100-80GB-HBM3: 32)"},
		{"any product", Gang{Groups: []PodGroup{{4, 8}}}, FitsNow, ""},
		{"no GPUs", Gang{Groups: []PodGroup{{3, 0}}}, FitsNow, "needs no GPUs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := x.Fits(tt.gang)
			if r.Verdict != tt.verdict || !strings.Contains(r.Message, tt.msg) {
				t.Errorf("Fits = %s %q, want %s containing %q", r.Verdict, r.Message, tt.verdict, tt.msg)
			}
		})
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
	x.DeleteGPUNode("h1")
	want(p, 3, 24, 16)
	x.DeletePod("p2")
	want(p, 3, 24, 24)
	if c, f := x.NodeFree("h0"); c != 8 || f != 8 {
		t.Fatalf("h0 = %d/%d", c, f)
	}
	// A pod on a node whose GPUNode comes later is counted when it comes.
	x.SetPod(pod("early", "late", 2, corev1.PodRunning))
	x.SetGPUNode(gpuNode("late", h100, 8))
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
	pods := map[string]*corev1.Pod{}
	for range 5000 {
		switch rng.IntN(5) {
		case 0:
			n := fmt.Sprintf("n%d", rng.IntN(20))
			gn := gpuNode(n, []string{h100, "B"}[rng.IntN(2)], rng.IntN(9), rng.IntN(10))
			nodes[n] = gn
			x.SetGPUNode(gn)
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
	if a, b := fmt.Sprint(x.Summary()), fmt.Sprint(y.Summary()); a != b {
		t.Fatalf("incremental %s != rebuilt %s", a, b)
	}
	for range 200 {
		g := Gang{Groups: []PodGroup{{int64(rng.IntN(6)), int64(1 + rng.IntN(8))}, {int64(rng.IntN(3)), int64(1 + rng.IntN(3))}}}
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
		groups := []PodGroup{{int64(rng.IntN(4)), int64(1 + rng.IntN(8))}, {int64(rng.IntN(3)), int64(1 + rng.IntN(4))}}
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
					_ = x.Fits(Gang{Groups: []PodGroup{{2, 8}}})
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

// buildFleet indexes nodes GPU nodes of two products and pods bound pods.
func buildFleet(nodes, pods int) *Index {
	x := NewIndex()
	for i := range nodes {
		product := h100
		if i%5 == 0 {
			product = "NVIDIA A100-SXM4-80GB"
		}
		x.SetGPUNode(gpuNode(fmt.Sprintf("node-%d", i), product, 8))
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
	gang := Gang{Groups: []PodGroup{{1, 8}, {511, 8}}, Product: "NVIDIA-H100-80GB-HBM3"}
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
		idx.SetGPUNode(&gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i)},
			Status: gpuv1alpha1.GPUNodeStatus{GPUs: []gpuv1alpha1.GPU{{Product: "NVIDIA H100"}}}})
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

// With RequireNodes, a GPUNode counts only while its Node exists, whatever
// the order the two arrive, leave and come back in.
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
		{"Node, then GPUNode", []step{{"node", "n"}, {"gpunode", "n"}}, 8, 1, 8},
		{"GPUNode, then Node", []step{{"gpunode", "n"}, {"node", "n"}}, 8, 1, 8},
		{"Node deleted", []step{{"node", "n"}, {"gpunode", "n"}, {"-node", "n"}}, 0, 0, 0},
		{"Node back", []step{{"node", "n"}, {"gpunode", "n"}, {"-node", "n"}, {"node", "n"}}, 8, 1, 8},
		{"GPUNode deleted, Node stays", []step{{"node", "n"}, {"gpunode", "n"}, {"-gpunode", "n"}}, 0, 0, 0},
		{"another node's Node", []step{{"node", "m"}, {"gpunode", "n"}}, 0, 0, 0},
		{"Node twice, deleted once", []step{{"node", "n"}, {"node", "n"}, {"gpunode", "n"}, {"-node", "n"}}, 0, 0, 0},
		{"updated while orphaned", []step{{"node", "n"}, {"gpunode", "n"}, {"-node", "n"}, {"gpunode4", "n"}, {"node", "n"}}, 4, 1, 4},
		{"required after the fact", []step{{"unjoined", ""}, {"gpunode", "n"}, {"require", ""}}, 0, 0, 0},
		{"required after the fact, with its Node", []step{{"unjoined", ""}, {"node", "n"}, {"gpunode", "n"}, {"require", ""}}, 8, 1, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewIndex()
			steps := tt.steps
			if len(steps) > 0 && steps[0].op == "unjoined" {
				steps = steps[1:]
			} else {
				x.RequireNodes()
			}
			x.SetPod(pod("p", "n", 2, corev1.PodRunning)) // a pod's GPUs are used whether or not they count
			for _, s := range steps {
				switch s.op {
				case "node":
					x.SetNode(s.name)
				case "-node":
					x.DeleteNode(s.name)
				case "gpunode":
					x.SetGPUNode(gpuNode(s.name, h100, 8))
				case "gpunode4":
					x.SetGPUNode(gpuNode(s.name, h100, 4))
				case "-gpunode":
					x.DeleteGPUNode(s.name)
				case "require":
					x.RequireNodes()
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
			if r := x.Fits(Gang{Groups: []PodGroup{{1, 1}}}); tt.total == 0 && r.Verdict != Never {
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
	x.RequireNodes()
	gpuNodes, nodes := map[string]*gpuv1alpha1.GPUNode{}, map[string]bool{}
	for range 3000 {
		n := fmt.Sprintf("n%d", rng.IntN(12))
		switch rng.IntN(4) {
		case 0:
			gn := gpuNode(n, h100, rng.IntN(9))
			gpuNodes[n] = gn
			x.SetGPUNode(gn)
		case 1:
			delete(gpuNodes, n)
			x.DeleteGPUNode(n)
		case 2:
			nodes[n] = true
			x.SetNode(n)
		case 3:
			delete(nodes, n)
			x.DeleteNode(n)
		}
	}
	y := NewIndex()
	for n, gn := range gpuNodes {
		if nodes[n] {
			y.SetGPUNode(gn)
		}
	}
	if a, b := fmt.Sprint(x.Summary()), fmt.Sprint(y.Summary()); a != b {
		t.Fatalf("incremental %s != rebuilt %s", a, b)
	}
}
