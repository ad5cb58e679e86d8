package agent

import (
	"errors"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/inventory"
)

// Once reads the node once, as a pass of the agent would, with no cluster:
// the PCI bus under sysfsRoot ("" skips it), then NVML (initialised and
// shut down again). NVML being unavailable is in the status's conditions,
// not an error. warn is what went wrong reading PCI or before collecting;
// err is set when nothing could be read at all.
func Once(lib nvml.Interface, sysfsRoot, simulated string, beforeCollect func() error) (st gpuv1alpha1.GPUNodeStatus, warn, err error) {
	in := statusInput{simulated: simulated}
	var warns []error
	if sysfsRoot != "" {
		var perr error
		in.pci, perr = inventory.ReadPCI(sysfsRoot)
		warns = append(warns, perr)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		in.down = &nvmlFailure{reason: gpuv1alpha1.ReasonNVMLInitFailed, message: nvml.ErrorString(ret)}
	} else {
		defer func() { _ = lib.Shutdown() }()
		if beforeCollect != nil {
			warns = append(warns, beforeCollect())
		}
		inv, cerr := collect.Collect(lib, nil)
		switch {
		case cerr == nil:
			in.inventory = &inv
			in.health = mergeHealth(nil, inv.GPUs, metav1.Now().Rfc3339Copy())
		case nvmlGone(cerr):
			in.down = &nvmlFailure{reason: gpuv1alpha1.ReasonNVMLLost, message: cerr.Error()}
		default:
			in.collectErr = cerr.Error()
		}
	}
	st = composeStatus(in)
	warn = errors.Join(warns...)
	if in.inventory == nil && len(in.pci) == 0 && warn != nil {
		return st, nil, warn
	}
	return st, warn, nil
}
