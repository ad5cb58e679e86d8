package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
)

// serverView is what the agent knows of its GPUNode.
type serverView struct {
	known    bool // read since the last write error or verify
	exists   bool
	last     gpuv1alpha1.GPUNodeStatus // the server's status, as far as we know
	restored bool                      // the first read's inventory and health are taken
	resetAsk string                    // the reset annotation's value, to remove once done
	noGPUs   bool                      // "no GPUs, no GPUNode" was logged
}

// sync reads the GPUNode when the agent does not know it, and at every pass
// while a GPU is unhealthy (a person may ask for a reset). The first read
// restores the last inventory, PCI devices and unhealthy GPUs.
func (a *Agent) sync(ctx context.Context) error {
	if a.srv.known && !a.anyUnhealthy() {
		return nil
	}
	gn := &gpuv1alpha1.GPUNode{}
	err := a.Client.Get(ctx, client.ObjectKey{Name: a.NodeName}, gn)
	switch {
	case apierrors.IsNotFound(err):
		a.srv.exists, a.srv.last, a.srv.resetAsk = false, gpuv1alpha1.GPUNodeStatus{}, ""
	case err != nil:
		return fmt.Errorf("reading GPUNode %s: %w", a.NodeName, err)
	default:
		a.srv.exists, a.srv.last = true, *gn.Status.DeepCopy()
		a.srv.resetAsk = gn.Annotations[gpuv1alpha1.AnnotationResetGPUHealth]
	}
	a.srv.known = true
	if !a.srv.restored {
		a.srv.restored = true
		a.restore(a.srv.last)
	}
	if a.srv.resetAsk != "" {
		n := a.resetHealth(a.srv.resetAsk)
		a.Log.Info("GPU health reset asked for", "annotation", a.srv.resetAsk, "cleared", n)
	}
	return nil
}

// restore takes what a previous agent published: the NVML inventory (kept
// while NVML is unavailable), the PCI devices and the unhealthy GPUs.
func (a *Agent) restore(st gpuv1alpha1.GPUNodeStatus) {
	if len(st.GPUs) > 0 || st.DriverVersion != "" {
		a.kept = &gpuv1alpha1.GPUNodeStatus{DriverVersion: st.DriverVersion, CUDADriverVersion: st.CUDADriverVersion,
			NVMLVersion: st.NVMLVersion, GPUs: append([]gpuv1alpha1.GPU(nil), st.GPUs...)}
		inventory.Summarize(a.kept)
	}
	if a.pci == nil {
		a.pci = append([]gpuv1alpha1.PCIDevice(nil), st.PCIDevices...)
	}
	a.restoreHealth(st)
}

// publish writes desired unless the server already holds exactly that. A
// GPUNode is created only for a node with GPUs (on the PCI bus or through
// NVML): a CPU node gets none.
func (a *Agent) publish(ctx context.Context, desired *gpuv1alpha1.GPUNodeStatus) error {
	if !a.srv.exists {
		if len(desired.PCIDevices) == 0 && len(desired.GPUs) == 0 {
			if !a.srv.noGPUs {
				a.Log.Info("no NVIDIA GPUs on the PCI bus or through NVML; not creating a GPUNode")
				a.srv.noGPUs = true
			}
			return nil
		}
		if err := a.create(ctx); err != nil {
			a.srv.known = false
			return err
		}
		a.srv.exists, a.srv.last = true, gpuv1alpha1.GPUNodeStatus{}
	}
	if apiequality.Semantic.DeepEqual(desired, &a.srv.last) {
		return nil
	}
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: a.NodeName}}
	if _, err := a.writer().Status(ctx, gn, &a.srv.last, desired); err != nil {
		a.srv.known = false // re-read before the next write
		return fmt.Errorf("GPUNode %s: %w", a.NodeName, err)
	}
	a.Metrics.writes.Inc()
	a.Log.Info("published GPU inventory", "gpus", desired.GPUCount, "pciDevices", len(desired.PCIDevices),
		"product", desired.Product, "mig", desired.MIG)
	a.srv.last = *desired
	return nil
}

// create makes the (empty) GPUNode so that its status can be applied. The
// manager adds the owner reference to the Node.
func (a *Agent) create(ctx context.Context) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(gpuv1alpha1.GroupVersion.String())
	u.SetKind("GPUNode")
	u.SetName(a.NodeName)
	if err := a.writer().ApplyFields(ctx, u, false, "GPUNode missing"); err != nil {
		return err
	}
	a.Metrics.writes.Inc()
	return nil
}

// finishReset removes the reset annotation once the status without the
// records it cleared is published; only if it still says what was acted
// on (a JSON patch test), so a newer request is not lost.
func (a *Agent) finishReset(ctx context.Context) {
	if a.srv.resetAsk == "" || !a.srv.exists {
		return
	}
	path := "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(gpuv1alpha1.AnnotationResetGPUHealth, "~", "~0"), "/", "~1")
	patch, err := json.Marshal([]map[string]string{
		{"op": "test", "path": path, "value": a.srv.resetAsk},
		{"op": "remove", "path": path},
	})
	if err != nil {
		return
	}
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: a.NodeName}}
	if err := a.writer().Patch(ctx, gn, client.RawPatch(types.JSONPatchType, patch), "GPU health reset done"); err != nil {
		a.Metrics.errors.WithLabelValues("write").Inc()
		a.Log.Error(err, "removing the health reset annotation")
		a.srv.known = false // read it again
		return
	}
	a.Metrics.writes.Inc()
	a.srv.resetAsk = ""
}
