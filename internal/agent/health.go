package agent

import (
	"fmt"
	"maps"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// The agent's health records: every GPU it knows to be unhealthy, by UUID,
// with the reason, the Xid and since when. They come from NVML events
// (critical Xids, double-bit ECC), from each collection's checks (row
// remaps, the volatile double-bit ECC counter) and, at start, from the
// GPUNode, so a GPU stays unhealthy across agent restarts. A record goes
// when the GPU's UUID is no longer in a successful collection (the GPU was
// reset or replaced), when a person asks (AnnotationResetGPUHealth), or,
// for a pending or failed row remap, when NVML no longer reports it.

// clearsWhenClean are the reasons a collection's check re-reads: their
// record goes when the check no longer finds them.
var clearsWhenClean = map[string]bool{
	gpuv1alpha1.HealthRowRemapPending: true,
	gpuv1alpha1.HealthRowRemapFailure: true,
	gpuv1alpha1.HealthGPULost:         true,
	gpuv1alpha1.HealthUnreadable:      true,
}

// records copies the health records.
func (a *Agent) records() map[string]gpuv1alpha1.GPUHealth {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.health)
}

// anyUnhealthy reports whether some GPU is unhealthy: the agent then reads
// its GPUNode at every pass, for a person's reset.
func (a *Agent) anyUnhealthy() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.health) > 0
}

// updateHealth merges a successful collection (whose GPUs carry what the
// checks read) into the records.
func (a *Agent) updateHealth(gpus []gpuv1alpha1.GPU) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.health = mergeHealth(a.health, gpus, metav1.Now().Rfc3339Copy())
}

// mergeHealth is the records after a successful collection of gpus.
func mergeHealth(records map[string]gpuv1alpha1.GPUHealth, gpus []gpuv1alpha1.GPU, now metav1.Time) map[string]gpuv1alpha1.GPUHealth {
	out := make(map[string]gpuv1alpha1.GPUHealth, len(records))
	for _, g := range gpus {
		rec, ok := records[g.UUID]
		if ok && clearsWhenClean[rec.Reason] && g.Health.Reason != rec.Reason {
			ok = false
		}
		switch {
		case ok:
			out[g.UUID] = rec
		case g.Health.State == gpuv1alpha1.GPUUnhealthy:
			h := g.Health
			h.Since = &now
			out[g.UUID] = h
		}
	}
	return out
}

// markUnhealthy records h for a GPU (an event); a GPU already unhealthy
// keeps its since.
func (a *Agent) markUnhealthy(uuid string, h gpuv1alpha1.GPUHealth) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := metav1.Now().Rfc3339Copy()
	h.Since = &now
	if old, ok := a.health[uuid]; ok && old.Since != nil {
		h.Since = old.Since
	}
	a.health[uuid] = h
}

// restoreHealth takes the unhealthy GPUs of a GPUNode's status.
func (a *Agent) restoreHealth(st gpuv1alpha1.GPUNodeStatus) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, g := range st.GPUs {
		if g.Health.State != gpuv1alpha1.GPUUnhealthy || g.UUID == "" {
			continue
		}
		h := g.Health
		if h.Since == nil {
			now := metav1.Now().Rfc3339Copy()
			h.Since = &now
		}
		a.health[g.UUID] = h
	}
}

// resetHealth forgets the records a reset annotation names ("all", or
// comma-separated UUIDs) and reports how many it forgot.
func (a *Agent) resetHealth(ask string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	if strings.TrimSpace(ask) == "all" {
		n = len(a.health)
		a.health = map[string]gpuv1alpha1.GPUHealth{}
		return n
	}
	for _, uuid := range strings.Split(ask, ",") {
		if _, ok := a.health[strings.TrimSpace(uuid)]; ok {
			delete(a.health, strings.TrimSpace(uuid))
			n++
		}
	}
	return n
}

// xidMeaning says what the common critical Xids mean.
var xidMeaning = map[uint64]string{
	48:  "double-bit ECC error",
	61:  "internal micro-controller breakpoint/warning",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping recording event",
	64:  "ECC page retirement or row remapper recording failure",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
}

// xidMessage is "Xid N" and what it means when known.
func xidMessage(xid uint64) string {
	if m, ok := xidMeaning[xid]; ok {
		return fmt.Sprintf("Xid %d: %s", xid, m)
	}
	return fmt.Sprintf("Xid %d", xid)
}
