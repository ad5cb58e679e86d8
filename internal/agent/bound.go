package agent

import (
	"fmt"
	"strings"
	"unicode/utf8"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// The GPUNode status schema's limits (the kubebuilder markers in
// apis/gpu/v1alpha1; TestAgentBoundsWhatNVMLReportsToTheSchema holds them
// to the real schema).
const (
	maxGPUs       = 64
	maxMIGDevices = 64
	maxPCIDevices = 64
	maxName       = 256  // products, UUIDs, health reasons
	maxVersion    = 128  // driver, CUDA driver and NVML versions
	maxShort      = 64   // bus IDs, architectures, compute capabilities, MIG profiles
	maxHealthMsg  = 1024 // a GPU's health message
	maxCondMsg    = 32768
)

// bound cuts st to what its schema admits, so that one value a driver
// reports past it (a longer product name or version, more GPUs or MIG
// devices than a node has) does not make every write of the node's status
// refused: strings are cut, the first devices kept, a negative number made
// 0. It returns what it cut, device counts first (none: nothing was).
func bound(st *gpuv1alpha1.GPUNodeStatus) bounder {
	var b bounder
	count(&b, gpuv1alpha1.ReasonTooManyGPUs, "gpus", "GPUs", &st.GPUs, maxGPUs)
	for i := range st.GPUs {
		if m := st.GPUs[i].MIG; m != nil {
			count(&b, gpuv1alpha1.ReasonTooManyMIGDevices, "gpus[].mig.devices", "MIG devices", &m.Devices, maxMIGDevices)
		}
	}
	count(&b, gpuv1alpha1.ReasonTooManyPCIDevices, "pciDevices", "devices", &st.PCIDevices, maxPCIDevices)
	b.str("driverVersion", &st.DriverVersion, maxVersion)
	b.str("cudaDriverVersion", &st.CUDADriverVersion, maxVersion)
	b.str("nvmlVersion", &st.NVMLVersion, maxVersion)
	b.str("simulated", &st.Simulated, maxShort)
	for i := range st.GPUs {
		g := &st.GPUs[i]
		const at = "gpus[]."
		b.str(at+"uuid", &g.UUID, maxName)
		b.str(at+"product", &g.Product, maxName)
		b.str(at+"architecture", &g.Architecture, maxShort)
		nonNegative(&b, at+"memoryMiB", &g.MemoryMiB)
		b.str(at+"computeCapability", &g.ComputeCapability, maxShort)
		b.str(at+"pciBusID", &g.PCIBusID, maxShort)
		b.str(at+"health.reason", &g.Health.Reason, maxName)
		b.str(at+"health.message", &g.Health.Message, maxHealthMsg)
		if g.MIG == nil {
			continue
		}
		for j := range g.MIG.Devices {
			d := &g.MIG.Devices[j]
			const at = "gpus[].mig.devices[]."
			b.str(at+"profile", &d.Profile, maxShort)
			b.str(at+"uuid", &d.UUID, maxName)
			nonNegative(&b, at+"memoryMiB", &d.MemoryMiB)
			nonNegative(&b, at+"gpuInstanceID", &d.GPUInstanceID)
			nonNegative(&b, at+"computeInstanceID", &d.ComputeInstanceID)
		}
	}
	for i := range st.PCIDevices {
		p := &st.PCIDevices[i]
		const at = "pciDevices[]."
		b.str(at+"busID", &p.BusID, maxShort)
		b.str(at+"deviceID", &p.DeviceID, maxShort)
		b.str(at+"class", &p.Class, maxShort)
		b.str(at+"product", &p.Product, maxName)
	}
	return b
}

// bounder is what bound cut: the reason of the first cut, and each field
// cut (its indices left out, so 64 GPUs' product names are one entry).
type bounder struct {
	reason string
	cuts   []cut
}

type cut struct {
	field, unit, action string
	most                int64 // the largest value cut
	times               int
}

func (b *bounder) cut(reason, field, unit, action string, n int64) {
	if b.reason == "" {
		b.reason = reason
	}
	for i := range b.cuts {
		if c := &b.cuts[i]; c.field == field {
			c.most, c.times = max(c.most, n), c.times+1
			return
		}
	}
	b.cuts = append(b.cuts, cut{field: field, unit: unit, action: action, most: n, times: 1})
}

// str cuts *s to limit characters (the schema counts characters, not
// bytes).
func (b *bounder) str(field string, s *string, limit int) {
	if n := utf8.RuneCountInString(*s); n > limit {
		*s = truncate(*s, limit)
		b.cut(gpuv1alpha1.ReasonValueTooLong, field, "characters", fmt.Sprintf("cut to %d", limit), int64(n))
	}
}

// count keeps the first limit items of *list.
func count[T any](b *bounder, reason, field, unit string, list *[]T, limit int) {
	if n := len(*list); n > limit {
		*list = (*list)[:limit]
		b.cut(reason, field, unit, fmt.Sprintf("the first %d kept", limit), int64(n))
	}
}

// nonNegative makes a negative *n 0.
func nonNegative[T int32 | int64](b *bounder, field string, n *T) {
	if *n < 0 {
		b.cut(gpuv1alpha1.ReasonNegativeValue, field, "", "made 0", int64(*n))
		*n = 0
	}
}

// truncate is s cut to its first limit characters.
func truncate(s string, limit int) string {
	i := 0
	for n := range s {
		if i == limit {
			return s[:n]
		}
		i++
	}
	return s
}

// message says what was cut: "gpus[].product: 360 characters (64 times),
// cut to 256".
func (b bounder) message() string {
	parts := make([]string, 0, len(b.cuts))
	for _, c := range b.cuts {
		p := fmt.Sprintf("%s: %d %s", c.field, c.most, c.unit)
		if c.times > 1 {
			p = fmt.Sprintf("%s: up to %d %s (%d times)", c.field, c.most, c.unit, c.times)
		}
		parts = append(parts, strings.TrimSpace(p)+", "+c.action)
	}
	return "the node reports more than the GPUNode status admits: " + strings.Join(parts, "; ")
}
