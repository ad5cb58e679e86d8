package agent

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
)

// The GPUNode's status is what the manager trusts of a node: its schema
// refuses what no node has (a negative count or memory, more GPUs or MIG
// devices than a node holds, strings longer than NVML's), so garbage fails
// its write instead of the labels, the index and the metrics carrying it.
// A full inventory (eight GPUs in MIG mode) fits. The agent cuts what it
// writes to these limits (TestAgentBoundsWhatNVMLReportsToTheSchema).
func TestGPUNodeStatusRefusesGarbage(t *testing.T) {
	ctx := context.Background()
	valid := func(t *testing.T) gpuv1alpha1.GPUNodeStatus {
		st, err := collect.Collect(sim(t, collect.SimOptions{System: "dgx-h100", MIG: "1g.10gb:7", Seed: t.Name()}), nil)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	tests := []struct {
		name  string
		edit  func(*gpuv1alpha1.GPUNodeStatus)
		field string // in the API server's answer; "" when valid
	}{
		{"a whole inventory", func(*gpuv1alpha1.GPUNodeStatus) {}, ""},
		{"negative count", func(st *gpuv1alpha1.GPUNodeStatus) { st.GPUCount = -1 }, "gpuCount"},
		{"negative memory", func(st *gpuv1alpha1.GPUNodeStatus) { st.GPUs[0].MemoryMiB = -1 }, "memoryMiB"},
		{"negative MIG memory", func(st *gpuv1alpha1.GPUNodeStatus) { st.GPUs[0].MIG.Devices[0].MemoryMiB = -1 }, "memoryMiB"},
		{"huge product", func(st *gpuv1alpha1.GPUNodeStatus) { st.GPUs[0].Product = strings.Repeat("H100 ", 100) }, "product"},
		{"huge driver version", func(st *gpuv1alpha1.GPUNodeStatus) { st.DriverVersion = strings.Repeat("5", 200) }, "driverVersion"},
		{"a host driver", func(st *gpuv1alpha1.GPUNodeStatus) {
			st.Driver = &gpuv1alpha1.GPUDriver{Source: gpuv1alpha1.DriverHost}
		}, ""},
		{"a driver from nowhere known", func(st *gpuv1alpha1.GPUNodeStatus) { st.Driver = &gpuv1alpha1.GPUDriver{Source: "Elsewhere"} }, "source"},
		{"more GPUs than a node has", func(st *gpuv1alpha1.GPUNodeStatus) {
			for i := len(st.GPUs); i <= 64; i++ {
				g := st.GPUs[0]
				g.Index, g.MIG = int32(i), nil
				st.GPUs = append(st.GPUs, g)
			}
		}, "gpus"},
		{"more MIG devices than a GPU has", func(st *gpuv1alpha1.GPUNodeStatus) {
			d := st.GPUs[0].MIG.Devices
			for len(st.GPUs[0].MIG.Devices) <= 64 {
				st.GPUs[0].MIG.Devices = append(st.GPUs[0].MIG.Devices, d...)
			}
		}, "devices"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "garbage-" + string(rune('a'+i))
			gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if err := env.Client.Create(ctx, gn); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(ctx, gn) })
			gn.Status = valid(t)
			tt.edit(&gn.Status)
			err := env.Client.Status().Update(ctx, gn)
			switch {
			case tt.field == "" && err != nil:
				t.Fatalf("a valid inventory refused: %v", err)
			case tt.field != "" && !apierrors.IsInvalid(err):
				t.Fatalf("written (err %v), want it refused for %s", err, tt.field)
			case tt.field != "" && !strings.Contains(err.Error(), tt.field):
				t.Fatalf("refused for %v, want %s", err, tt.field)
			}
		})
	}
}
