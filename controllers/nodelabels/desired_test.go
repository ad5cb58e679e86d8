package nodelabels

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/sharing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func mustSharing(t testing.TB, cfg string) *sharing.Node {
	t.Helper()
	c, err := sharing.Parse([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return &sharing.Node{Key: "test", Config: c}
}

func nvmlUnavailableStatus(st gpuv1alpha1.GPUNodeStatus) gpuv1alpha1.GPUNodeStatus {
	st = *st.DeepCopy()
	now := metav1.Now()
	st.Conditions = append(st.Conditions,
		metav1.Condition{Type: gpuv1alpha1.ConditionNVMLUnavailable, Status: metav1.ConditionTrue, Reason: gpuv1alpha1.ReasonNVMLInitFailed, Message: "ERROR_LIBRARY_NOT_FOUND", LastTransitionTime: now},
		metav1.Condition{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: gpuv1alpha1.ReasonNVMLInitFailed, Message: "NVML unavailable", LastTransitionTime: now})
	return st
}

var pciH100 = []gpuv1alpha1.PCIDevice{
	{BusID: "0000:18:00.0", DeviceID: "0x2330", Class: "0x030200", Product: "NVIDIA H100 80GB HBM3"},
	{BusID: "0000:2a:00.0", DeviceID: "0x2330", Class: "0x030200", Product: "NVIDIA H100 80GB HBM3"},
}

// Golden: every input's labels, one "key=value" a line, sorted, in
// testdata/<name>.golden (go test -run TestDesiredGolden -update rewrites
// them).
func TestDesiredGolden(t *testing.T) {
	h100 := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(2)})
	a100MIG := collected(t, collect.SimOptions{System: "dgx-a100", GPUs: intPtr(2), MIG: "1g.5gb:7"})
	ts4 := "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n"
	tests := []struct {
		name string
		in   Input
	}{
		{"h100-unshared", Input{GPUNode: &h100, Sharing: &sharing.Node{}}},
		{"h100-time-slicing-4", Input{GPUNode: &h100, Sharing: mustSharing(t, ts4)}},
		{"h100-time-slicing-renamed", Input{GPUNode: &h100, Sharing: mustSharing(t,
			"version: v1\nsharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: 4}]}}\n")}},
		{"h100-mps-2", Input{GPUNode: &h100, Sharing: mustSharing(t, "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n")}},
		{"h100-sharing-a-mig-resource-only", Input{GPUNode: &h100, Sharing: mustSharing(t,
			"version: v1\nsharing: {timeSlicing: {resources: [{name: mig-1g.10gb, replicas: 4}]}}\n")}},
		{"a100-mig-single-time-slicing-4", Input{GPUNode: &a100MIG, MIGStrategy: "single", Sharing: mustSharing(t, ts4)}},
		{"pci-only-h100", Input{GPUNode: &gpuv1alpha1.GPUNodeStatus{PCIDevices: pciH100}}},
		{"pci-only-unknown-product", Input{GPUNode: &gpuv1alpha1.GPUNodeStatus{PCIDevices: []gpuv1alpha1.PCIDevice{{BusID: "0000:01:00.0", DeviceID: "0x9999"}}}}},
		{"pci-only-mixed-products", Input{GPUNode: &gpuv1alpha1.GPUNodeStatus{PCIDevices: append(slices.Clone(pciH100),
			gpuv1alpha1.PCIDevice{BusID: "0000:3a:00.0", DeviceID: "0x20b0", Product: "NVIDIA A100-SXM4-40GB"})}}},
		{"nfd-only-no-gpunode", Input{NodeLabels: map[string]string{gpuv1alpha1.LabelNFDPCI3DNVIDIA: "true", "team": "ml"}}},
		{"nfd-false-no-gpunode", Input{NodeLabels: map[string]string{gpuv1alpha1.LabelNFDPCINVIDIA: "false"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Desired(tt.in)
			assertValid(t, got)
			var b strings.Builder
			for _, k := range slices.Sorted(maps.Keys(got)) {
				fmt.Fprintf(&b, "%s=%s\n", k, got[k])
			}
			path := filepath.Join("testdata", tt.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if b.String() != string(want) {
				t.Errorf("labels differ from %s:\n got:\n%s\nwant:\n%s", path, b.String(), want)
			}
		})
	}
}

// NVML failing changes no label: the agent keeps its last good GPUs (same
// labels), and a GPUNode with none left keeps what the labeller set.
func TestDesiredNVMLUnavailable(t *testing.T) {
	h100 := collected(t, collect.SimOptions{System: "dgx-h100"})
	ts := mustSharing(t, "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 3}]}}\n")
	good := Desired(Input{GPUNode: &h100, Sharing: ts})
	kept := nvmlUnavailableStatus(h100)
	if got := Desired(Input{GPUNode: &kept, Sharing: ts}); !maps.Equal(got, good) {
		t.Errorf("NVML unavailable, GPUs kept: labels %v, want %v", got, good)
	}

	// An agent that lost its GPUs with NVML: the labels stay as set.
	node := maps.Clone(good)
	node["team"] = "ml"
	node[gpuv1alpha1.LabelMIGConfig] = "all-1g.10gb"
	empty := nvmlUnavailableStatus(gpuv1alpha1.GPUNodeStatus{})
	if got := Desired(Input{GPUNode: &empty, NodeLabels: node, Managed: slices.Sorted(maps.Keys(good))}); !maps.Equal(got, good) {
		t.Errorf("NVML unavailable, no GPUs: labels %v, want the previous %v", got, good)
	}
	// A key in the record that the labeller never sets (the record edited
	// by hand, copied from another node) is not its: keeping it would take
	// a person's label over, and remove it once NVML is back.
	if got := Desired(Input{GPUNode: &empty, NodeLabels: node, Managed: append(slices.Sorted(maps.Keys(good)), "team", gpuv1alpha1.LabelMIGConfig)}); !maps.Equal(got, good) {
		t.Errorf("NVML unavailable, a foreign key recorded: labels %v, want the previous %v", got, good)
	}
	// NVML available and no GPUs: they are gone, and so are the labels.
	gone := gpuv1alpha1.GPUNodeStatus{}
	if got := Desired(Input{GPUNode: &gone, NodeLabels: node, Managed: slices.Sorted(maps.Keys(good))}); len(got) != 0 {
		t.Errorf("GPUs gone: labels %v", got)
	}
	// ... unless NFD still sees them on the bus.
	node[gpuv1alpha1.LabelNFDPCINVIDIA] = "true"
	if got := Desired(Input{GPUNode: &gone, NodeLabels: node}); !maps.Equal(got, map[string]string{gpuv1alpha1.LabelPresent: "true"}) {
		t.Errorf("GPUs gone, NFD label: labels %v", got)
	}
}

// A config that cannot be read changes no sharing label.
func TestDesiredConfigUnreadable(t *testing.T) {
	h100 := collected(t, collect.SimOptions{System: "dgx-h100"})
	shared := Desired(Input{GPUNode: &h100, Sharing: mustSharing(t, "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}\n")})
	if shared[gpuv1alpha1.LabelProduct] != "NVIDIA-H100-80GB-HBM3-SHARED" {
		t.Fatalf("product %q", shared[gpuv1alpha1.LabelProduct])
	}
	if got := Desired(Input{GPUNode: &h100, NodeLabels: shared, Sharing: nil}); !maps.Equal(got, shared) {
		t.Errorf("unreadable config: labels %v, want the node's %v", got, shared)
	}
	// A node never labelled gets no sharing labels from an unreadable config.
	got := Desired(Input{GPUNode: &h100, Sharing: nil})
	for _, k := range []string{gpuv1alpha1.LabelReplicas, gpuv1alpha1.LabelSharingStrategy} {
		if _, ok := got[k]; ok {
			t.Errorf("%s set from an unreadable config", k)
		}
	}
	if got[gpuv1alpha1.LabelProduct] != "NVIDIA-H100-80GB-HBM3" || got[gpuv1alpha1.LabelPresent] != "true" {
		t.Errorf("labels %v", got)
	}
}

func TestSharedProductFitsALabel(t *testing.T) {
	long := strings.Repeat("A", 63)
	if got := sharedProduct(long); len(got) != 63 || !strings.HasSuffix(got, "-SHARED") {
		t.Errorf("sharedProduct(63 chars) = %q", got)
	}
}

func TestUnhealthyTaint(t *testing.T) {
	st := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(3)})
	st.GPUs[1].Health = gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: "RowRemapPending"}
	st.GPUs[2].Health = gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: "XidCriticalError", Xid: 79}
	noReason := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(1)})
	noReason.GPUs[0].Health = gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy}
	healthy := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(1)})
	tests := []struct {
		name    string
		st      *gpuv1alpha1.GPUNodeStatus
		enabled bool
		want    string // the value; "" for no taint
	}{
		{"first unhealthy GPU's reason", &st, true, "RowRemapPending"},
		{"remediation off", &st, false, ""},
		{"all healthy", &healthy, true, ""},
		{"no GPUNode", nil, true, ""},
		{"unhealthy without a reason", &noReason, true, "Unhealthy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := UnhealthyTaint(tt.st, tt.enabled)
			switch {
			case tt.want == "" && got != nil:
				t.Errorf("taint %+v, want none", got)
			case tt.want != "" && (got == nil || got.Value != tt.want || got.Key != gpuv1alpha1.TaintUnhealthy || got.Effect != corev1.TaintEffectNoSchedule):
				t.Errorf("taint %+v, want %s=%s:NoSchedule", got, gpuv1alpha1.TaintUnhealthy, tt.want)
			}
		})
	}
}

func TestWithTaint(t *testing.T) {
	foreign := corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule}
	ours := corev1.Taint{Key: gpuv1alpha1.TaintUnhealthy, Value: "XidCriticalError", Effect: corev1.TaintEffectNoSchedule}
	other := corev1.Taint{Key: gpuv1alpha1.TaintUnhealthy, Value: "DoubleBitECC", Effect: corev1.TaintEffectNoSchedule}
	evict := corev1.Taint{Key: gpuv1alpha1.TaintUnhealthy, Value: "ops", Effect: corev1.TaintEffectNoExecute}
	tests := []struct {
		name   string
		taints []corev1.Taint
		want   *corev1.Taint
		out    []corev1.Taint
	}{
		{"add beside a foreign taint", []corev1.Taint{foreign}, &ours, []corev1.Taint{foreign, ours}},
		{"replace the reason", []corev1.Taint{other, foreign}, &ours, []corev1.Taint{foreign, ours}},
		{"lift, the foreign stays", []corev1.Taint{foreign, ours}, nil, []corev1.Taint{foreign}},
		{"lift from none", nil, nil, []corev1.Taint{}},
		{"another effect of the key stays", []corev1.Taint{evict, ours}, nil, []corev1.Taint{evict}},
		{"add beside another effect of the key", []corev1.Taint{evict}, &ours, []corev1.Taint{evict, ours}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := WithTaint(tt.taints, tt.want)
			if !slices.EqualFunc(got, tt.out, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) {
				t.Errorf("WithTaint = %+v, want %+v", got, tt.out)
			}
		})
	}
}

// Whatever NVML calls the product, a shared node's labels are valid label
// values: a product that leaves nothing valid gets no -SHARED label.
func TestDesiredSharedOddProduct(t *testing.T) {
	ts := mustSharing(t, "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}\n")
	for _, product := range []string{"???", "  ", "-", strings.Repeat("x", 70) + " H100"} {
		st := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(1)})
		st.GPUs[0].Product, st.Product = product, product
		got := Desired(Input{GPUNode: &st, Sharing: ts})
		assertValid(t, got)
		if got[gpuv1alpha1.LabelReplicas] != "4" {
			t.Errorf("product %q: replicas %q", product, got[gpuv1alpha1.LabelReplicas])
		}
	}
}
