package collect

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// BenchmarkCollect is one collection's NVML reads and the GPUNode status
// built from them on a simulated DGX H100 (8 GPUs): the part of the node
// agent's CPU per collection that the inventory itself costs (the rest is
// the process: its API calls, metrics and garbage collection).
func BenchmarkCollect(b *testing.B) {
	for _, mig := range []string{"", "1g.10gb:7"} {
		name := "dgx-h100"
		if mig != "" {
			name += "/mig=" + mig
		}
		b.Run(name, func(b *testing.B) {
			s, err := Simulate(SimOptions{System: "dgx-h100", Seed: "node-a", MIG: mig})
			if err != nil {
				b.Fatal(err)
			}
			if ret := s.Init(); ret != nvml.SUCCESS {
				b.Fatal(ret)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Collect(s, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
