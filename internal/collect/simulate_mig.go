package collect

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// MIGDisabled is the MIG file's spec for "MIG off".
const MIGDisabled = "disabled"

// ReloadMIG is the simulated MIG manager's hand on the GPUs; the agent
// calls it before each collection. It reads the simulator's MIG file
// (SimOptions.MIGFile) if it exists: one spec per line, line i for GPU i,
// or a single line for every GPU; a spec is what SimOptions.MIG takes
// ("PROFILE:COUNT[,PROFILE:COUNT...]") or "disabled" (MIG off). When the
// content differs from what it last acted on, it destroys every GPU
// instance, sets the MIG mode and creates the new instances, so the next
// inventory shows the new devices. An invalid file (a bad spec, a profile
// the GPU does not offer, more lines than GPUs) changes nothing and is
// returned as an error once per content; a missing file changes nothing.
func (s *Simulator) ReloadMIG() error {
	if s.migFile == "" || s.driverGone() {
		return nil // no MIG manager works without a driver
	}
	b, err := os.ReadFile(s.migFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("MIG file: %w", err)
	}
	content := string(b)
	if s.migSeen != nil && *s.migSeen == content {
		return nil
	}
	s.migSeen = &content
	plans, err := s.planMIG(content)
	if err != nil {
		return fmt.Errorf("MIG file %s: %w; the GPUs stay as they are", s.migFile, err)
	}
	for i, dev := range s.devs {
		if err := reconfigureMIG(dev, plans[i]); err != nil {
			s.migSeen = nil // try again
			return fmt.Errorf("MIG file %s: GPU %d: %w", s.migFile, i, err)
		}
	}
	return nil
}

// migPlan is one GPU's MIG layout: off, or these GPU instances.
type migPlan struct {
	disabled bool
	infos    []nvml.GpuInstanceProfileInfo
}

// planMIG parses and checks the MIG file's content against every GPU.
func (s *Simulator) planMIG(content string) ([]migPlan, error) {
	lines := strings.Split(strings.TrimSpace(content), "\n")
	if len(lines) != 1 && len(lines) != len(s.devs) {
		return nil, fmt.Errorf("%d lines for %d GPUs: want one line, or one per GPU", len(lines), len(s.devs))
	}
	plans := make([]migPlan, len(s.devs))
	for i, dev := range s.devs {
		spec := strings.TrimSpace(lines[0])
		if len(lines) > 1 {
			spec = strings.TrimSpace(lines[i])
		}
		if spec == MIGDisabled {
			plans[i].disabled = true
			continue
		}
		if spec == "" {
			return nil, fmt.Errorf("GPU %d: empty spec", i)
		}
		reqs, err := parseMIGSpec(spec)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		if plans[i].infos, err = resolveMIG(dev, reqs); err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
	}
	return plans, nil
}

// reconfigureMIG destroys a mock GPU's instances and applies plan, with GPU
// instance IDs from 0 again (so MIG UUIDs are the same for the same layout).
func reconfigureMIG(dev *server.Device, plan migPlan) error {
	dev.RLock()
	gis := make([]*server.GpuInstance, 0, len(dev.GpuInstances))
	for gi := range dev.GpuInstances {
		gis = append(gis, gi)
	}
	dev.RUnlock()
	for _, gi := range gis {
		gi.RLock()
		cis := make([]*server.ComputeInstance, 0, len(gi.ComputeInstances))
		for ci := range gi.ComputeInstances {
			cis = append(cis, ci)
		}
		gi.RUnlock()
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				return check("nvmlComputeInstanceDestroy", ret)
			}
		}
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			return check("nvmlGpuInstanceDestroy", ret)
		}
	}
	dev.Lock()
	dev.GpuInstanceCounter = 0
	dev.Unlock()
	if plan.disabled {
		if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.SUCCESS {
			return check("nvmlDeviceSetMigMode", ret)
		}
		return nil
	}
	return createInstances(dev, plan.infos)
}
