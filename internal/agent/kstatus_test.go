package agent

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/testenv"
)

// kstatus (Helm's --wait, Flux) reads a bare node waiting for its driver
// and a node whose driver is being replaced InProgress, a collection retry
// InProgress, a node with an unhealthy GPU Failed, and a healthy inventory
// Current; the conditions carry over from pass to pass without piling up.
func TestGPUNodeKstatus(t *testing.T) {
	pci := []gpuv1alpha1.PCIDevice{{BusID: "0000:17:00.0", DeviceID: "0x2330"}}
	inv := &gpuv1alpha1.GPUNodeStatus{GPUs: []gpuv1alpha1.GPU{{Index: 0, UUID: "GPU-0", Product: "NVIDIA H100 80GB HBM3"}}}
	bad := map[string]gpuv1alpha1.GPUHealth{"GPU-0": {State: gpuv1alpha1.GPUUnhealthy, Reason: gpuv1alpha1.HealthXidCriticalError, Message: "Xid 79"}}
	tests := []struct {
		name string
		in   statusInput
		want kstatus.Status
	}{
		{"bare node, no driver yet", statusInput{pci: pci, down: &nvmlFailure{gpuv1alpha1.ReasonNVMLInitFailed, "library not found"}}, kstatus.InProgressStatus},
		{"driver being replaced", statusInput{pci: pci, inventory: inv, down: &nvmlFailure{gpuv1alpha1.ReasonNVMLLost, "driver not loaded"}}, kstatus.InProgressStatus},
		{"collection failed", statusInput{pci: pci, inventory: inv, collectErr: "nvmlDeviceGetMemoryInfo: unknown error"}, kstatus.InProgressStatus},
		{"unhealthy GPU", statusInput{pci: pci, inventory: inv, health: bad}, kstatus.FailedStatus},
		{"healthy", statusInput{pci: pci, inventory: inv}, kstatus.CurrentStatus},
	}
	gvk := gpuv1alpha1.GroupVersion.WithKind("GPUNode")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "n", Generation: 1}, Status: composeStatus(tt.in)}
			if got := testenv.KStatus(t, gn, gvk); got != tt.want {
				t.Fatalf("kstatus %s, want %s (conditions %+v)", got, tt.want, gn.Status.Conditions)
			}
			// The next pass starts from what the server holds.
			tt.in.last = gn.Status
			again := composeStatus(tt.in)
			if len(again.Conditions) != len(gn.Status.Conditions) {
				t.Fatalf("%d conditions after a second pass, want %d: %+v", len(again.Conditions), len(gn.Status.Conditions), again.Conditions)
			}
		})
	}
	// Recovery clears Stalled and Reconciling.
	st := composeStatus(statusInput{pci: pci, inventory: inv, health: bad})
	st = composeStatus(statusInput{last: st, pci: pci, inventory: inv})
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: st}
	if got := testenv.KStatus(t, gn, gvk); got != kstatus.CurrentStatus {
		t.Fatalf("after the GPU's reset kstatus %s, want Current (%+v)", got, st.Conditions)
	}
}
