package agent

import (
	"sync"
	"testing"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
)

func TestDriverSource(t *testing.T) {
	tests := []struct {
		path          string
		containerRoot bool // a library under /run/nvidia/driver now
		want          gpuv1alpha1.DriverSource
	}{
		{"/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1", true, gpuv1alpha1.DriverContainer},
		{"/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", false, gpuv1alpha1.DriverHost},
		// A driver container came up since NVML was loaded from the host:
		// the kernel's driver may be the container's.
		{"/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", true, ""},
		{"", false, ""}, // the dynamic loader's
		{"/opt/driver/usr/lib64/libnvidia-ml.so.1", false, ""},
		{"/hostile/usr/lib64/libnvidia-ml.so.1", false, ""},
		{"/run/nvidia/driver-old/usr/lib64/libnvidia-ml.so.1", false, ""},
		{"/host", false, ""},
	}
	for _, tt := range tests {
		if got := driverSource(tt.path, tt.containerRoot); got != tt.want {
			t.Errorf("driverSource(%q, %v) = %q, want %q", tt.path, tt.containerRoot, got, tt.want)
		}
	}
}

// sourced is a simulated library that says where its driver comes from, as
// DriverLibrary does.
type sourced struct {
	*collect.Simulator
	mu     sync.Mutex
	source gpuv1alpha1.DriverSource
}

func (s *sourced) Source() gpuv1alpha1.DriverSource {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.source
}

func (s *sourced) set(src gpuv1alpha1.DriverSource) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.source = src
}

// The agent says where the driver it reads the GPUs through comes from,
// with each collection; a library that cannot tell (a simulation) leaves
// status.driver unset.
func TestAgentReportsTheDriverSource(t *testing.T) {
	const node = "agent-driver-source"
	lib := &sourced{Simulator: sim(t, collect.SimOptions{System: "dgx-h100", Seed: node}), source: gpuv1alpha1.DriverHost}
	r := start(t, node, lib, "dgx-h100")
	waitFor(t, node, "driver source Host", func(gn *gpuv1alpha1.GPUNode) bool {
		return gn.Status.Driver != nil && gn.Status.Driver.Source == gpuv1alpha1.DriverHost && gn.Status.GPUCount == 8
	})
	lib.set(gpuv1alpha1.DriverContainer)
	r.agent.trigger <- struct{}{}
	waitFor(t, node, "driver source Container", func(gn *gpuv1alpha1.GPUNode) bool {
		return gn.Status.Driver != nil && gn.Status.Driver.Source == gpuv1alpha1.DriverContainer
	})
	lib.set("")
	r.agent.trigger <- struct{}{}
	waitFor(t, node, "no driver source", func(gn *gpuv1alpha1.GPUNode) bool { return gn.Status.Driver == nil })
}
