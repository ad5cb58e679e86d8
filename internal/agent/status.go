package agent

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
)

// statusInput is what one pass knows.
type statusInput struct {
	last       gpuv1alpha1.GPUNodeStatus        // what the server holds (its conditions carry over)
	inventory  *gpuv1alpha1.GPUNodeStatus       // the last inventory read through NVML; nil: none yet
	pci        []gpuv1alpha1.PCIDevice          // the PCI bus
	health     map[string]gpuv1alpha1.GPUHealth // unhealthy GPUs by UUID
	down       *nvmlFailure                     // NVML unavailable
	collectErr string                           // NVML up, but this pass's collection failed
	simulated  string
}

// composeStatus is the status the agent publishes: the last NVML inventory
// (never cleared by NVML failing), the PCI devices, each GPU's health from
// the health records, and the agent's conditions; all of it cut to what
// the schema admits (bound), and Truncated saying what was cut.
func composeStatus(in statusInput) gpuv1alpha1.GPUNodeStatus {
	var st gpuv1alpha1.GPUNodeStatus
	if in.inventory != nil {
		st = *in.inventory.DeepCopy()
	}
	st.Conditions = nil
	for i := range st.GPUs {
		st.GPUs[i].Health = gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUHealthy}
		if h, ok := in.health[st.GPUs[i].UUID]; ok {
			st.GPUs[i].Health = h
		}
	}
	st.PCIDevices = append([]gpuv1alpha1.PCIDevice(nil), in.pci...)
	st.Simulated = in.simulated
	cut := bound(&st)
	inventory.Summarize(&st)
	st.Conditions = append([]metav1.Condition(nil), in.last.Conditions...)
	// Times in seconds, as the server keeps them, so that the GPUNode the
	// agent's watch sees equals what it wrote.
	now := metav1.Now().Rfc3339Copy()
	for _, c := range conditions(in, st) {
		c.Message, c.LastTransitionTime = truncate(c.Message, maxCondMsg), now
		meta.SetStatusCondition(&st.Conditions, c)
	}
	if len(cut.cuts) == 0 {
		meta.RemoveStatusCondition(&st.Conditions, gpuv1alpha1.ConditionTruncated)
	} else {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: gpuv1alpha1.ConditionTruncated,
			Status: metav1.ConditionTrue, Reason: cut.reason, Message: cut.message(), LastTransitionTime: now})
	}
	return st
}

func conditions(in statusInput, st gpuv1alpha1.GPUNodeStatus) []metav1.Condition {
	switch {
	case in.down != nil:
		return withKstatus(unavailable(*in.down, st, in.inventory != nil))
	case in.collectErr != "":
		shown := "; showing the last inventory"
		if in.inventory == nil {
			shown = "; no inventory read through NVML yet"
		}
		return withKstatus([]metav1.Condition{{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionFalse,
			Reason: gpuv1alpha1.ReasonCollectionFailed, Message: in.collectErr + shown}})
	case in.inventory == nil:
		return nil // before the first attempt
	}
	return withKstatus(ready(st))
}

// withKstatus adds the conditions kstatus reads (Helm's --wait, Flux,
// kubectl wait): Reconciling while the agent retries (NVML not there yet,
// or failing), so a node being bootstrapped or upgraded reads InProgress;
// Stalled while a GPU is unhealthy, which only a person fixes, so it reads
// Failed; neither once every GPU is read and healthy (Current). Ready keeps
// its own reason and message; the two derive from it.
func withKstatus(cs []metav1.Condition) []metav1.Condition {
	r := cs[0]
	rec := metav1.Condition{Type: gpuv1alpha1.ConditionReconciling, Status: metav1.ConditionFalse, Reason: r.Reason, Message: r.Message}
	stalled := metav1.Condition{Type: gpuv1alpha1.ConditionStalled, Status: metav1.ConditionFalse,
		Reason: gpuv1alpha1.ReasonAllHealthy, Message: "no GPU needs a person"}
	switch r.Reason {
	case gpuv1alpha1.ReasonCollected, gpuv1alpha1.ReasonUnprivileged:
		// Unprivileged is how the agent is run: no retry changes it.
	case gpuv1alpha1.ReasonUnhealthyGPUs:
		stalled.Status, stalled.Reason, stalled.Message = metav1.ConditionTrue, r.Reason, r.Message
	default:
		rec.Status = metav1.ConditionTrue
	}
	return append(cs, rec, stalled)
}

func ready(st gpuv1alpha1.GPUNodeStatus) []metav1.Condition {
	r := metav1.Condition{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: gpuv1alpha1.ReasonCollected,
		Message: fmt.Sprintf("%d GPUs read through NVML", st.GPUCount)}
	var bad []string
	for _, g := range st.GPUs {
		if g.Health.State == gpuv1alpha1.GPUUnhealthy {
			bad = append(bad, fmt.Sprintf("GPU %d (%s): %s", g.Index, g.Health.Reason, g.Health.Message))
		}
	}
	if len(bad) > 0 {
		r.Status, r.Reason = metav1.ConditionFalse, gpuv1alpha1.ReasonUnhealthyGPUs
		r.Message = fmt.Sprintf("%d of %d GPUs unhealthy: %v", len(bad), st.GPUCount, bad)
	}
	return []metav1.Condition{r, {Type: gpuv1alpha1.ConditionNVMLUnavailable, Status: metav1.ConditionFalse,
		Reason: gpuv1alpha1.ReasonNVMLAvailable, Message: "NVML initialised"}}
}

// unavailable: NVML cannot be used. NVMLUnavailable carries NVML's words;
// Ready says what the status still shows.
func unavailable(f nvmlFailure, st gpuv1alpha1.GPUNodeStatus, kept bool) []metav1.Condition {
	what := "NVML could not be initialised"
	switch f.reason {
	case gpuv1alpha1.ReasonNVMLLost:
		what = "NVML calls failed"
	case gpuv1alpha1.ReasonUnprivileged:
		what = "the agent runs unprivileged (nodeAgent.privileged=false), without the GPUs' device nodes " +
			"unless NVIDIA's runtime is the node's default, and NVML could not be initialised"
	}
	shows := fmt.Sprintf("%d GPUs on the PCI bus, none read through NVML yet", len(st.PCIDevices))
	if kept {
		shows = fmt.Sprintf("keeping the last inventory read through NVML (%d GPUs) and %d GPUs on the PCI bus",
			st.GPUCount, len(st.PCIDevices))
	}
	return []metav1.Condition{
		{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: f.reason,
			Message: fmt.Sprintf("%s (%s): %s; retrying", what, f.message, shows)},
		{Type: gpuv1alpha1.ConditionNVMLUnavailable, Status: metav1.ConditionTrue, Reason: f.reason, Message: f.message},
	}
}
