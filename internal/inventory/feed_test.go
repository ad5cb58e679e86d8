package inventory_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// The index follows GPUNodes and pods on a real API server through the
// shared informers.
func TestFeedFollowsTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := cache.New(env.Config, cache.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	idx := inventory.NewIndex()
	if err := inventory.Feed(ctx, c, idx, "loom-system"); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()

	sim, err := collect.Simulate(collect.SimOptions{System: "dgx-h100", Seed: "feed-0"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := collect.Collect(sim, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Its Node: a GPUNode counts only while the Node exists. Its device
	// plugin time-slices 4 replicas per GPU: 32 nvidia.com/gpu.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "feed-0"}}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	node.Status.Allocatable = corev1.ResourceList{inventory.GPUResource: resource.MustParse("32")}
	node.Status.Capacity = node.Status.Allocatable
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if err := env.Client.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "feed-0"}}
	if err := env.Client.Create(ctx, gn); err != nil {
		t.Fatal(err)
	}
	gn.Status = st
	if err := env.Client.Status().Update(ctx, gn); err != nil {
		t.Fatal(err)
	}
	if err := env.CreateNamespace(ctx, "feed"); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "feed", Name: "trainer"},
		Spec: corev1.PodSpec{NodeName: "feed-0", Containers: []corev1.Container{{Name: "c", Image: "x",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{inventory.GPUResource: resource.MustParse("3")}}}}},
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitFree(t, idx, 32, 29)
	// Cordoned: nothing free now, but the node still counts.
	node.Spec.Unschedulable = true
	if err := env.Client.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	gang := inventory.Gang{Groups: []inventory.PodGroup{{Count: 1, GPUs: 4}}}
	testenvEventually(t, func() bool { return idx.Fits(gang).Verdict == inventory.NotNow })
	if err := env.Client.Delete(ctx, p, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	waitFree(t, idx, 32, 32)
	// Without its GPUNode the Node's allocatable still counts.
	if err := env.Client.Delete(ctx, gn); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, node); err != nil {
		t.Fatal(err)
	}
	waitFree(t, idx, 0, 0)
}

func testenvEventually(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 15s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A GPUNode someone wrote for a node that does not exist, status and all,
// adds no GPUs; its Node appearing counts them, its Node going uncounts
// them.
func TestFeedSkipsGPUNodesWithoutANode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := cache.New(env.Config, cache.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	idx := inventory.NewIndex()
	if err := inventory.Feed(ctx, c, idx, "loom-system"); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	sim, err := collect.Simulate(collect.SimOptions{System: "dgx-h100", Seed: "phantom"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := collect.Collect(sim, nil)
	if err != nil {
		t.Fatal(err)
	}
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "phantom"}}
	if err := env.Client.Create(ctx, gn); err != nil {
		t.Fatal(err)
	}
	gn.Status = st
	if err := env.Client.Status().Update(ctx, gn); err != nil {
		t.Fatal(err)
	}
	// A real node's GPUNode, written after the phantom's: once it counts,
	// the informers have delivered the phantom too.
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "real"}}); err != nil {
		t.Fatal(err)
	}
	real := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "real"}}
	if err := env.Client.Create(ctx, real); err != nil {
		t.Fatal(err)
	}
	real.Status = st
	if err := env.Client.Status().Update(ctx, real); err != nil {
		t.Fatal(err)
	}
	waitNodeFree(t, idx, "real", 8, 8)
	if c, _ := idx.NodeFree("phantom"); c != 0 {
		t.Fatalf("the phantom GPUNode adds %d GPUs", c)
	}
	for _, s := range idx.Summary() {
		if s.Nodes != 1 || s.Total != 8 {
			t.Fatalf("summary %+v counts the phantom", idx.Summary())
		}
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "phantom"}}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	waitNodeFree(t, idx, "phantom", 8, 8)
	if err := env.Client.Delete(ctx, node); err != nil {
		t.Fatal(err)
	}
	waitNodeFree(t, idx, "phantom", 0, 0)
}

func waitFree(t *testing.T, idx *inventory.Index, capacity, free int64) {
	t.Helper()
	waitNodeFree(t, idx, "feed-0", capacity, free)
}

func waitNodeFree(t *testing.T, idx *inventory.Index, node string, capacity, free int64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, f := idx.NodeFree(node)
		if c == capacity && f == free {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: %d/%d GPUs free, want %d/%d", node, f, c, free, capacity)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
