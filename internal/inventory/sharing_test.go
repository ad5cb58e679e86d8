package inventory

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

// renamingSource is a ClusterPolicy naming ConfigMap loom-system/dp, one
// key per kind of sharing: rename (nvidia.com/small), time-slicing that
// fails requests greater than one (strict), the same without it (lax), MPS.
func renamingSource() sharing.Source {
	ts := func(flag string, res string) string {
		return "version: v1\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: " + flag + "\n    resources:\n" + res
	}
	return sharing.Source{
		Policy:    &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "dp"},
		Namespace: "loom-system",
		Data: map[string]string{
			"small":  ts("false", "    - name: nvidia.com/gpu\n      rename: small\n      replicas: 4\n"),
			"strict": ts("true", "    - name: nvidia.com/gpu\n      replicas: 4\n"),
			"lax":    ts("false", "    - name: nvidia.com/gpu\n      replicas: 4\n"),
			"mps":    "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
		},
	}
}

// configured is a Node whose device plugin runs the config key.
func configured(n *corev1.Node, key string) *corev1.Node {
	return labelled(n, gpuv1alpha1.LabelDevicePluginConfig, key)
}

// podSpec is one pod whose containers ask for n[i] of res each.
func podSpec(res corev1.ResourceName, n ...int64) *corev1.PodSpec {
	spec := &corev1.PodSpec{}
	for _, v := range n {
		spec.Containers = append(spec.Containers, corev1.Container{Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{res: *resource.NewQuantity(v, resource.DecimalSI)}}})
	}
	return spec
}

// A device plugin that gives at most one unit of a shared resource to a
// container (time-slicing with failRequestsGreaterThanOne, MPS) takes no
// pod with a container asking for more: kubelet would fail it at
// admission, so a gang with nowhere else to go never fits, and the
// message names the node, the config and the fix.
func TestFitsOneSharedUnitPerContainer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodes   []*corev1.Node
		spec    *corev1.PodSpec
		want    Verdict
		message []string // substrings
	}{
		{name: "strict, 2 per container", nodes: []*corev1.Node{configured(kubeNode("ts-1", "nvidia.com/gpu", 32), "strict"), configured(kubeNode("ts-0", "nvidia.com/gpu", 32), "strict")},
			spec: podSpec(GPUResource, 2), want: Never,
			message: []string{"needs 4 pods × 2 nvidia.com/gpu", "the device plugin of node ts-0 (and 1 more node) gives at most 1 nvidia.com/gpu to a container",
				`time-slicing, device plugin config "strict" of ConfigMap loom-system/dp, failRequestsGreaterThanOne: true`,
				"ask for 1 nvidia.com/gpu per container, or set failRequestsGreaterThanOne: false"}},
		{name: "strict, 1 per container in two containers", nodes: []*corev1.Node{configured(kubeNode("ts-0", "nvidia.com/gpu", 32), "strict")},
			spec: podSpec(GPUResource, 1, 1), want: FitsNow},
		{name: "strict, 1 per pod", nodes: []*corev1.Node{configured(kubeNode("ts-0", "nvidia.com/gpu", 32), "strict")},
			spec: podSpec(GPUResource, 1), want: FitsNow},
		{name: "lax, 2 per container", nodes: []*corev1.Node{configured(kubeNode("ts-0", "nvidia.com/gpu", 32), "lax")},
			spec: podSpec(GPUResource, 2), want: FitsNow},
		{name: "MPS always gives one", nodes: []*corev1.Node{configured(kubeNode("mps-0", "nvidia.com/gpu", 16), "mps")},
			spec: podSpec(GPUResource, 2), want: Never,
			message: []string{"node mps-0 gives at most 1 nvidia.com/gpu to a container (mps, device plugin config \"mps\"", "ask for 1 nvidia.com/gpu per container"}},
		{name: "a node without sharing takes them", nodes: []*corev1.Node{configured(kubeNode("ts-0", "nvidia.com/gpu", 32), "strict"), kubeNode("whole-0", "nvidia.com/gpu", 8)},
			spec: podSpec(GPUResource, 2), want: FitsNow},
		{name: "too big for the node without sharing", nodes: []*corev1.Node{configured(kubeNode("ts-0", "nvidia.com/gpu", 32), "strict"), kubeNode("whole-0", "nvidia.com/gpu", 4)},
			spec: podSpec(GPUResource, 8), want: Never,
			message: []string{"none with more than 4", "the device plugin of node ts-0 gives at most 1 nvidia.com/gpu to a container", "it can never fit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex()
			x.SetSharing(renamingSource())
			for _, n := range tc.nodes {
				x.SetNode(n)
			}
			r := x.Fits(Gang{Groups: PodGroups(4, tc.spec)})
			if r.Verdict != tc.want {
				t.Fatalf("verdict %s (%s), want %s", r.Verdict, r.Message, tc.want)
			}
			for _, m := range tc.message {
				if !strings.Contains(r.Message, m) {
					t.Errorf("message %q lacks %q", r.Message, m)
				}
			}
		})
	}
}

// A shared resource renamed by the config (rename: small) is a GPU
// resource: the nodes offering it, the pods using it and the fit count it,
// once the config is known; another nvidia.com/ resource (a NIC) is not.
func TestRenamedSharedResourceIsAGPU(t *testing.T) {
	const small corev1.ResourceName = "nvidia.com/small"
	x := NewIndex()
	node := configured(kubeNode("ts-0", string(small), 32, "nvidia.com/rdma_shared", 10), "small")
	x.SetNode(node)
	if c, _ := x.NodeResourceFree("ts-0", small); c != 0 {
		t.Fatalf("without the config, %s is not known and offers %d", small, c)
	}
	if !x.SetSharing(renamingSource()) {
		t.Fatal("SetSharing: the names did not change")
	}
	x.SetNode(node) // as Feed does when the names change
	x.SetPod(podOf("p", "ts-0", small, 30))
	if c, f := x.NodeResourceFree("ts-0", small); c != 32 || f != 2 {
		t.Fatalf("%s: %d offered, %d free; want 32, 2", small, c, f)
	}
	if c, _ := x.NodeResourceFree("ts-0", "nvidia.com/rdma_shared"); c != 0 {
		t.Fatalf("a NIC is counted as a GPU resource: %d", c)
	}
	if r := x.Fits(Gang{Groups: PodGroups(4, podSpec(small, 1))}); r.Verdict != NotNow || !strings.Contains(r.Message, "nvidia.com/small") {
		t.Fatalf("4 pods × 1 %s with 2 free: %s %s", small, r.Verdict, r.Message)
	}
	if r := x.Fits(Gang{Groups: PodGroups(4, podSpec("nvidia.com/rdma_shared", 1))}); r.Verdict != FitsNow || r.Message != "needs no GPUs" {
		t.Fatalf("a NIC gang: %s %s", r.Verdict, r.Message)
	}
	if x.SetSharing(renamingSource()) {
		t.Fatal("SetSharing again: the names changed")
	}
}

// A renamed shared resource loses the units of the devices it is made of,
// not of the node's other GPUs: a MIG profile time-sliced under another
// name follows that profile's health, and a whole GPU failing beside it
// takes nothing from it.
func TestRenamedResourceFollowsItsDevicesHealth(t *testing.T) {
	const small corev1.ResourceName = "nvidia.com/small"
	src := sharing.Source{
		Policy:    &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "dp"},
		Namespace: "loom-system",
		Data: map[string]string{"mig-small": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n" +
			"    - name: nvidia.com/mig-1g.10gb\n      rename: small\n      replicas: 2\n"},
	}
	// GPU 0 whole, GPU 1 split into seven 1g.10gb devices, each time-sliced
	// twice under nvidia.com/small.
	gpuNodeWith := func(bad int) *gpuv1alpha1.GPUNode {
		gn := gpuNode("mix-0", h100, 2, bad)
		gn.Status.GPUs[1].MIG = &gpuv1alpha1.MIGStatus{Capable: true, CurrentMode: gpuv1alpha1.MIGEnabled}
		for range 7 {
			gn.Status.GPUs[1].MIG.Devices = append(gn.Status.GPUs[1].MIG.Devices, gpuv1alpha1.MIGDevice{Profile: "1g.10gb"})
		}
		return gn
	}
	for _, tc := range []struct {
		name             string
		bad              int // the unhealthy GPU's index
		wantGPU, wantSml int64
	}{
		{"the MIG GPU fails", 1, 1, 0},
		{"the whole GPU fails", 0, 0, 14},
		{"none fails", -1, 1, 14},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex()
			x.SetSharing(src)
			x.SetNode(configured(kubeNode("mix-0", "nvidia.com/gpu", 1, string(small), 14), "mig-small"))
			x.SetGPUNode(gpuNodeWith(tc.bad))
			if c, _ := x.NodeResourceFree("mix-0", GPUResource); c != tc.wantGPU {
				t.Errorf("nvidia.com/gpu offered %d, want %d", c, tc.wantGPU)
			}
			if c, _ := x.NodeResourceFree("mix-0", small); c != tc.wantSml {
				t.Errorf("%s offered %d, want %d", small, c, tc.wantSml)
			}
		})
	}
}
