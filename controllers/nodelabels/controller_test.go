package nodelabels

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/agent"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

func startManager(t *testing.T) {
	t.Helper()
	reg := &manager.Registry{}
	reg.Add("gpu-labels", Setup)
	opts := testenv.ManagerOptions(t)
	opts.LeaderElect = false
	env.StartManager(t, opts, reg)
}

// runAgent runs a simulated node agent for node until the returned stop.
func runAgent(t *testing.T, node string, o collect.SimOptions) func() {
	t.Helper()
	o.Seed = node
	s, err := collect.Simulate(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent.Agent{NodeName: node, Lib: s, Client: env.Client, Log: ctrl.Log.WithName("agent"), Interval: time.Hour,
		Simulated: o.System, Metrics: agent.NewMetrics()}
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

func createNode(t *testing.T, name string, labels map[string]string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := env.Client.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	return n
}

func nodeLabels(t *testing.T, name string) (map[string]string, *corev1.Node) {
	t.Helper()
	n := &corev1.Node{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n.Labels, n
}

func TestLabellerFollowsTheInventory(t *testing.T) {
	ctx := context.Background()
	// Without a ClusterPolicy the MIG strategy is mixed; remove any another
	// test left.
	if err := env.Client.DeleteAllOf(ctx, &gpuv1alpha1.ClusterPolicy{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		list := &gpuv1alpha1.ClusterPolicyList{}
		if err := env.Client.List(ctx, list); err != nil || len(list.Items) > 0 {
			return fmt.Errorf("%d ClusterPolicies left (%v)", len(list.Items), err)
		}
		return nil
	})
	startManager(t)
	hand := map[string]string{"team": "ml", "nvidia.com/gpu.deploy.dcgm": "false"}
	node := createNode(t, "labels-a100", hand)
	createNode(t, "labels-cpu", map[string]string{"team": "web"})

	stop := runAgent(t, node.Name, collect.SimOptions{System: "dgx-a100", MIG: "3g.20gb:2"})
	testenv.Eventually(t, 20*time.Second, func() error {
		l, _ := nodeLabels(t, node.Name)
		for k, v := range map[string]string{gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelCount: "8", gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB",
			gpuv1alpha1.LabelMIGStrategy: "mixed", "nvidia.com/mig-3g.20gb.count": "16"} {
			if l[k] != v {
				return fmt.Errorf("%s = %q, want %q (labels %v)", k, l[k], v, l)
			}
		}
		return nil
	})
	testMIGStrategyFromPolicy(t, node.Name)
	testHandLabelsOwnerAndIdle(t, node, hand)
	testDeletedLabelComesBack(t, node.Name)
	testGPUsGoAway(t, node, hand, stop)
}

// A ClusterPolicy with the single strategy: the MIG devices stand in for
// the GPUs, as GFD labels them; without it, the strategy is mixed again.
func testMIGStrategyFromPolicy(t *testing.T, name string) {
	ctx := context.Background()
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "labels-single"},
		Spec: gpuv1alpha1.ClusterPolicySpec{MIG: gpuv1alpha1.MIGSpec{Strategy: gpuv1alpha1.MIGStrategySingle}}}
	if err := env.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		l, _ := nodeLabels(t, name)
		for k, v := range map[string]string{gpuv1alpha1.LabelCount: "16", gpuv1alpha1.LabelProduct: "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", gpuv1alpha1.LabelMIGStrategy: "single"} {
			if l[k] != v {
				return fmt.Errorf("%s = %q, want %q (labels %v)", k, l[k], v, l)
			}
		}
		if _, ok := l["nvidia.com/mig-3g.20gb.count"]; ok {
			return fmt.Errorf("mixed-strategy label left under single")
		}
		return nil
	})
	if err := env.Client.Delete(ctx, cp); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if l, _ := nodeLabels(t, name); l[gpuv1alpha1.LabelMIGStrategy] != "mixed" {
			return fmt.Errorf("strategy %q after the policy went", l[gpuv1alpha1.LabelMIGStrategy])
		}
		return nil
	})
}

// Hand-set labels stay, the Node owns its GPUNode, and nothing is written
// in the steady state.
func testHandLabelsOwnerAndIdle(t *testing.T, node *corev1.Node, hand map[string]string) {
	ctx := context.Background()
	l, n := nodeLabels(t, node.Name)
	for k, v := range hand {
		if l[k] != v {
			t.Errorf("hand-set label %s = %q, want %q", k, l[k], v)
		}
	}
	gn := &gpuv1alpha1.GPUNode{}
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, gn); err != nil {
			return err
		}
		if len(gn.OwnerReferences) != 1 || gn.OwnerReferences[0].UID != node.UID {
			return fmt.Errorf("owner references %+v", gn.OwnerReferences)
		}
		return nil
	})

	// Steady state: nothing is written.
	rvNode, rvGPUNode := n.ResourceVersion, gn.ResourceVersion
	time.Sleep(2 * time.Second)
	_, n = nodeLabels(t, node.Name)
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, gn); err != nil {
		t.Fatal(err)
	}
	if n.ResourceVersion != rvNode || gn.ResourceVersion != rvGPUNode {
		t.Errorf("steady state wrote: node rv %s -> %s, GPUNode rv %s -> %s", rvNode, n.ResourceVersion, rvGPUNode, gn.ResourceVersion)
	}
}

// A label deleted by hand comes back.
func testDeletedLabelComesBack(t *testing.T, name string) {
	ctx := context.Background()
	_, n := nodeLabels(t, name)
	patch := client.MergeFrom(n.DeepCopy())
	delete(n.Labels, gpuv1alpha1.LabelCount)
	if err := env.Client.Patch(ctx, n, patch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if l, _ := nodeLabels(t, name); l[gpuv1alpha1.LabelCount] != "8" {
			return fmt.Errorf("gpu.count = %q", l[gpuv1alpha1.LabelCount])
		}
		return nil
	})
}

// The GPUs go away: every label the labeller set goes, the rest stays.
func testGPUsGoAway(t *testing.T, node *corev1.Node, hand map[string]string, stop func()) {
	stop()
	runAgent(t, node.Name, collect.SimOptions{System: "dgx-a100", GPUs: new(int)})
	testenv.Eventually(t, 20*time.Second, func() error {
		l, n := nodeLabels(t, node.Name)
		for k := range l {
			if strings.HasPrefix(k, "nvidia.com/") && k != "nvidia.com/gpu.deploy.dcgm" {
				return fmt.Errorf("label %s still set", k)
			}
		}
		if _, ok := n.Annotations[AnnotationManagedLabels]; ok {
			return fmt.Errorf("annotation %s still set", AnnotationManagedLabels)
		}
		return nil
	})
	l, _ := nodeLabels(t, node.Name)
	for k, v := range hand {
		if l[k] != v {
			t.Errorf("hand-set label %s = %q after the GPUs went, want %q", k, l[k], v)
		}
	}
	if l, _ := nodeLabels(t, "labels-cpu"); len(l) != 1 || l["team"] != "web" {
		t.Errorf("CPU node labels = %v", l)
	}
}
