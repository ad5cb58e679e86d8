package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// A node whose image brings its own driver (as cloud GPU images do): eight
// H100s that NVML reads from the start, no device plugin yet, so no GPU
// resource. Its agent says the driver is the host's; Loom labels the node
// nvidia.com/gpu.deploy.driver=pre-installed before any policy, so no
// driver pod of Loom's ever lands there, and the rest of the stack comes
// up on the host's driver until the node advertises nvidia.com/gpu. A bare
// node beside it gets Loom's driver, and no such label.
func TestHostDriverNodeGetsNoLoomDriver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const host, bare = "hostdrv-0", "hostdrv-bare-0"
	testNode(t, host, framework.NodeSpec{GPUs: 8, Bare: true})
	testNode(t, bare, framework.NodeSpec{GPUs: 8, Bare: true})
	rel, _ := startLoomManager(t)
	sim := cluster.StartNodeSim(ctx, loomNS)
	for _, n := range []string{host, bare} {
		spec, err := sim.Add(framework.AgentSpec{Node: n, System: "dgx-h100", HostDriver: n == host})
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, rel, spec)
	}

	eventually(t, 60*time.Second, func() (bool, string) {
		gn, err := gpuNode(host)
		if err != nil {
			return false, err.Error()
		}
		l, _ := nodeLabels(host)
		ok := gn.Status.Driver != nil && gn.Status.Driver.Source == gpuv1alpha1.DriverHost && len(gn.Status.GPUs) == 8 &&
			l[gpuv1alpha1.LabelDeployDriver] == gpuv1alpha1.DeployDriverPreInstalled
		return ok, fmt.Sprintf("driver %+v, %d GPUs, %s=%q", gn.Status.Driver, len(gn.Status.GPUs), gpuv1alpha1.LabelDeployDriver, l[gpuv1alpha1.LabelDeployDriver])
	})

	createPolicy(t, &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "hostdriver"}})
	eventually(t, 3*time.Minute, func() (bool, string) {
		h, b := allocatableGPUs(t, host), allocatableGPUs(t, bare)
		return h == 8 && b == 8, fmt.Sprintf("allocatable nvidia.com/gpu: %s %d, %s %d; %s log %v", host, h, bare, b, host, sim.Events(host))
	})
	eventually(t, 2*time.Minute, func() (bool, string) {
		cp := &gpuv1alpha1.ClusterPolicy{}
		if err := cluster.Client.Get(ctx, client.ObjectKey{Name: "hostdriver"}, cp); err != nil {
			return false, err.Error()
		}
		return cp.Status.State == gpuv1alpha1.PolicyReady, fmt.Sprintf("policy %s: %+v", cp.Status.State, cp.Status.Conditions)
	})
	drivers := map[string]int{}
	pods := &corev1.PodList{}
	if err := cluster.Client.List(ctx, pods, client.InNamespace(loomNS), client.MatchingLabels{gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		drivers[p.Spec.NodeName]++
	}
	if drivers[host] != 0 || drivers[bare] != 1 {
		t.Errorf("driver pods by node %v: want none on %s (the host's driver) and one on %s", drivers, host, bare)
	}
	if l, _ := nodeLabels(bare); l[gpuv1alpha1.LabelDeployDriver] != "" {
		t.Errorf("%s, whose driver is Loom's, is labelled %s=%q", bare, gpuv1alpha1.LabelDeployDriver, l[gpuv1alpha1.LabelDeployDriver])
	}
	if gn, err := gpuNode(bare); err != nil || gn.Status.Driver == nil || gn.Status.Driver.Source != gpuv1alpha1.DriverContainer {
		t.Errorf("%s's GPUNode driver: %+v (%v), want source Container", bare, gn.Status.Driver, err)
	}
}
