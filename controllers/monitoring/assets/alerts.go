package assets

import (
	"fmt"
	"strings"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// Thresholds of the alerts.
const (
	// GPUTempHighCelsius: datacenter GPUs slow their clocks from their
	// slowdown temperature, around 90 °C (nvidia-smi -q -d TEMPERATURE shows
	// it); 85 °C held for GPUTempHighFor means the cooling is failing before
	// throughput suffers.
	GPUTempHighCelsius = 85
	// FBUsedHighRatio of the framebuffer (used / (used + free)): at this
	// level the next allocation usually fails with CUDA out of memory.
	// Frameworks that reserve memory up front stay below it (JAX takes 75%).
	FBUsedHighRatio = 0.95
	// IdleUtilizationPercent: an allocated GPU whose utilisation never
	// reaches this is idle.
	IdleUtilizationPercent = 1
)

// How long a condition must hold (for:) and the windows alerts look back.
const (
	// GPUTempHighFor ignores bursts (a job starting, fans ramping up).
	GPUTempHighFor = "15m"
	// FBUsedHighFor ignores a checkpoint or evaluation step that peaks.
	FBUsedHighFor = "15m"
	// XidRecentWindow is how long a new non-critical Xid alerts.
	// DCGM_FI_DEV_XID_ERRORS keeps the last Xid until dcgm-exporter restarts,
	// so "new" is "different from what it was XidRecentWindow ago".
	XidRecentWindow = "10m"
	// ECCWindow is how far back an increase of the ECC counters alerts.
	ECCWindow = "10m"
	// RowRemapPendingFor lets a remap that a reset is already applying
	// finish quietly.
	RowRemapPendingFor = "5m"
	// IdleWindow and IdleFor: an allocated GPU is idle when its utilisation
	// stayed below IdleUtilizationPercent over every IdleWindow for IdleFor:
	// IdleFor after a pod got it, IdleWindow+IdleFor after its last busy
	// moment. The for: part keeps a pod that has just started (and has no
	// history yet) from alerting.
	IdleWindow = "15m"
	IdleFor    = "1h"
	// ExporterDownFor covers a dcgm-exporter restart (DCGM takes a minute
	// to start) and a node's reboot after a driver upgrade.
	ExporterDownFor = "10m"
	// ExporterAbsentFor leaves time for a first rollout and first scrape.
	ExporterAbsentFor = "15m"
	// GPUMissingFor covers dcgm-exporter's start, when some GPUs report late.
	GPUMissingFor = "15m"
	// NodeUnhealthyFor and NodeAgentDownFor ignore one failed collection.
	NodeUnhealthyFor = "5m"
	NodeAgentDownFor = "10m"
	// NodeAgentStaleSeconds: an agent whose last successful collection is
	// older (five of its default 60 s intervals) is not reporting.
	NodeAgentStaleSeconds = "300"
	// NodeAgentAbsentFor leaves time for a first rollout and first scrape.
	NodeAgentAbsentFor = "15m"
	// OperandNotReadyFor leaves a driver rollout, which restarts the
	// operands of a node one after another, time to finish.
	OperandNotReadyFor = "30m"
	// DriverUpgradeFailedFor lets the upgrade's own retry go first.
	DriverUpgradeFailedFor = "5m"
)

// criticalXids need the GPU reset or the node drained (NVIDIA's Xid
// catalog, "resolution"):
//
//	48  double-bit ECC error
//	62  internal micro-controller halt
//	63  ECC page retirement or row-remapping event (a reset applies it)
//	64  ECC page retirement or row-remapping failure
//	74  NVLink error
//	79  GPU has fallen off the bus
//	92  high single-bit ECC error rate
//	94  contained ECC error (the application on that memory died)
//	95  uncontained ECC error
//	119 GSP RPC timeout
//	120 GSP error
//	140 unrecovered ECC error
//	154 GPU recovery action changed (the driver asks for a reset or reboot)
//
// Every other Xid is a warning: the common ones (13, 31, 43, 45) are the
// application's fault, not the GPU's.
var criticalXids = []int{48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 154}

// gpuID are the labels that name a physical GPU; hardware alerts aggregate
// to them, so that a GPU split by MIG alerts once, not once per instance.
const gpuID = "node, gpu, UUID, modelName"

// xidLabels add, to a GPU, the Xid (err_code, err_msg: labels of recent
// dcgm-exporters, so that each Xid is a series of its own) and the pod it
// hit.
const xidLabels = xidID + ", namespace, pod"

// xidID names one Xid series of a GPU, whichever pod has the GPU.
const xidID = gpuID + ", err_code, err_msg"

const xid = `DCGM_FI_DEV_XID_ERRORS{` + exporter + `}`

// agentLastSuccess is when the node agent of a node (its PodMonitor's
// node label) last collected and published the inventory.
const agentLastSuccess = `loom_node_agent_last_success_timestamp_seconds`

// inDriverUpgrade are the nodes in a driver upgrade (cordoned for it, its
// driver and operands restarted): the node alerts leave them out, and
// OperandNotReady does not count them. max: every manager replica reports
// them.
const inDriverUpgrade = `max by (node) (loom_gpunode_driver_upgrade) == 1`

// driverStarting are the nodes whose driver pod of Loom's is not ready: a
// first install building the kernel module takes over ten minutes, and
// the agent (NVML) and dcgm-exporter cannot work before it is loaded. A
// driver that never gets ready is LoomGPUOperandNotReady's. Nodes with the
// host's own driver have no such pod and are not among them.
const driverStarting = `max by (node) (` + operandNotReady + `{component="` + gpuv1alpha1.OperandDriver + `"})`

// operandNotReady is 1 for each operand whose pods on a node are none of
// them Ready; an operand ready there, or without a pod there, has no
// series.
const operandNotReady = `loom_gpunode_operand_not_ready`

// nodeDown are the nodes whose Node is not Ready (powered off, rebooting,
// its kubelet silent): their exporter, agent and operands stop with them.
// kube-prometheus-stack's KubeNodeNotReady tells it once; Loom's node
// alerts leave them out rather than page once per DaemonSet with a
// runbook that reads pods. Their for: starts again when the node is back.
const nodeDown = `max by (node) (loom_gpunode_node_ready) == 0`

// agentUnprivileged are the nodes whose agent runs unprivileged and so
// cannot read their GPUs: a configuration (nodeAgent.privileged=false),
// not an agent failing.
const agentUnprivileged = `max by (node) (loom_gpunode_agent_unprivileged)`

// cordoned are the nodes cordoned (spec.unschedulable), for maintenance
// or by Loom's driver upgrade. A maintenance stops, restarts and tests
// their GPUs, driver and operands on purpose: the alerts that a node's
// exporter, agent, GPUs or operands are gone leave them out, as they do a
// node in its driver upgrade, and the GPU health alerts (an Xid, ECC,
// heat, a burn-in filling the memory) are one severity lower there
// (cordonedSeverity), still told but paging no one: cordoning is the
// first step of their runbooks. kube-state-metrics' own
// kube_node_spec_unschedulable would do, where it is scraped with the
// node label; Loom's needs neither.
const cordoned = `max by (node) (loom_gpunode_unschedulable)`

// xidIs selects the Xid series whose value is one of codes.
func xidIs(codes []int) string {
	terms := make([]string, len(codes))
	for i, c := range codes {
		terms[i] = fmt.Sprintf("%s == %d", xid, c)
	}
	return strings.Join(terms, "\n  or ")
}

// Pieces of descriptions.
const (
	gpuOnNode = `GPU {{ $labels.gpu }} ({{ $labels.modelName }}, {{ $labels.UUID }}) on node {{ $labels.node }}`
	// inPod names the workload on the GPU, if any.
	inPod = `{{ with $labels.pod }} (pod {{ $labels.namespace }}/{{ . }}){{ end }}`
	// migInstance names the MIG device, if the series is one.
	migInstance = `{{ with $labels.GPU_I_ID }} (MIG instance {{ . }}, {{ $labels.GPU_I_PROFILE }}){{ end }}`
	drainNode   = `kubectl cordon {{ $labels.node }} and drain it (kubectl drain {{ $labels.node }} --ignore-daemonsets --delete-emptydir-data)`
)

func healthAlerts() []alert {
	return []alert{{
		name:     "LoomGPUXidCritical",
		severity: SeverityCritical,
		expr:     "max by (" + xidLabels + ") (\n  " + xidIs(criticalXids) + "\n)",
		summary:  `GPU {{ $labels.gpu }} on {{ $labels.node }} reported Xid {{ $value | printf "%.0f" }}: it needs a reset.`,
		description: gpuOnNode + ` reported Xid {{ $value | printf "%.0f" }}{{ with $labels.err_msg }} ({{ . }}){{ end }}` + inPod +
			`. This Xid leaves the GPU unusable or corrupting memory until it is reset.`,
		runbook: drainNode + `, then reset the GPU (nvidia-smi -r -i {{ $labels.gpu }}) or reboot the node. ` +
			`The value stays until dcgm-exporter restarts: delete the node's dcgm-exporter pod after the reset. ` +
			`Xid 79 or 64 again after a reset, or a row-remap failure: take the node out and RMA the GPU.`,
		cordonedSeverity: SeverityWarning,
	}, {
		name:     "LoomGPUXidError",
		severity: SeverityWarning,
		// A GPU's Xid that differs from XidRecentWindow ago (or whose
		// series, labelled by err_code, is new) is a new Xid. The GPU's,
		// whichever pod's labels its series carry: a GPU that goes to
		// another pod shows its old Xid in a series of new labels. Only
		// for a GPU Prometheus had XidRecentWindow ago: after a gap (a
		// Prometheus restarted, an exporter unscraped) nothing says the
		// Xid is new, and the one dcgm-exporter kept would alert again.
		expr: "max by (" + xidLabels + ") (\n  (" + xid + " != 0 unless on (" + xidID + ") (\n" +
			"    max by (" + xidID + ") (" + xid + " offset " + XidRecentWindow + ") == max by (" + xidID + ") (" + xid + ")\n  ))\n" +
			"  and on (" + gpuID + ") group by (" + gpuID + ") (" + xid + " offset " + XidRecentWindow + ")\n" +
			"  unless (\n  " + xidIs(criticalXids) + "\n  )\n)",
		summary: `GPU {{ $labels.gpu }} on {{ $labels.node }} reported Xid {{ $value | printf "%.0f" }}.`,
		description: gpuOnNode + ` reported Xid {{ $value | printf "%.0f" }}{{ with $labels.err_msg }} ({{ . }}){{ end }}` + inPod +
			` in the last ` + XidRecentWindow + `. A repeat of the same Xid is not seen until another Xid comes between.`,
		runbook: `Xids 13, 31, 43 and 45 are mostly the application's: check the logs of the pod on the GPU ` +
			`(illegal memory access, a kernel that was killed). Other Xids, or the same one from several pods on this GPU: ` +
			`look the Xid up in NVIDIA's Xid catalog and check the node's kernel log (dmesg | grep -i xid).`,
		cordonedSeverity: SeverityInfo,
	}, {
		name:     "LoomGPUUncorrectableECCErrors",
		severity: SeverityCritical,
		expr:     `max by (` + gpuID + `) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{` + exporter + `}[` + ECCWindow + `])) > 0`,
		summary:  `GPU {{ $labels.gpu }} on {{ $labels.node }} had uncorrectable ECC errors.`,
		description: gpuOnNode + ` had {{ $value | printf "%.0f" }} uncorrectable (double-bit) ECC error(s) in the last ` + ECCWindow +
			`; the application using that memory has most likely crashed.`,
		runbook: drainNode + ` and reset the GPU: the reset applies the pending row remap (A100 and later) and clears the volatile count. ` +
			`Errors again after the reset, or LoomGPURowRemapFailure: RMA the GPU.`,
		cordonedSeverity: SeverityWarning,
	}, {
		name:        "LoomGPURowRemapFailure",
		severity:    SeverityCritical,
		expr:        `max by (` + gpuID + `) (DCGM_FI_DEV_ROW_REMAP_FAILURE{` + exporter + `}) > 0`,
		summary:     `GPU {{ $labels.gpu }} on {{ $labels.node }} failed to remap a memory row.`,
		description: gpuOnNode + ` has no spare memory rows left to remap a failing one: its memory errors can no longer be repaired.`,
		runbook: drainNode + ` and keep it out of service; collect nvidia-smi -q -d ROW_REMAPPER and nvidia-bug-report.sh ` +
			`and RMA the GPU.`,
		cordonedSeverity: SeverityWarning,
	}, {
		name:        "LoomGPURowRemapPending",
		severity:    SeverityWarning,
		expr:        `max by (` + gpuID + `) (DCGM_FI_DEV_ROW_REMAP_PENDING{` + exporter + `}) > 0`,
		holdFor:     RowRemapPendingFor,
		summary:     `GPU {{ $labels.gpu }} on {{ $labels.node }} needs a reset to remap a memory row.`,
		description: gpuOnNode + ` has a memory row remap pending for ` + RowRemapPendingFor + `; it takes effect at the next GPU reset.`,
		runbook: `When its workload allows, ` + drainNode + ` and reset the GPU (nvidia-smi -r -i {{ $labels.gpu }}) ` +
			`or reboot the node; then check that DCGM_FI_DEV_ROW_REMAP_PENDING is 0.`,
		cordonedSeverity: SeverityInfo,
	}, {
		name:        "LoomGPUTemperatureHigh",
		severity:    SeverityWarning,
		expr:        fmt.Sprintf(`max by (%s) (DCGM_FI_DEV_GPU_TEMP{%s}) > %d`, gpuID, exporter, GPUTempHighCelsius),
		holdFor:     GPUTempHighFor,
		summary:     `GPU {{ $labels.gpu }} on {{ $labels.node }} runs at {{ $value | printf "%.0f" }} °C.`,
		description: gpuOnNode + fmt.Sprintf(` has been above %d °C for %s (now {{ $value | printf "%%.0f" }} °C).`, GPUTempHighCelsius, GPUTempHighFor),
		runbook: `Compare with the node's other GPUs: one hot GPU points at its fan or heatsink, all of them at the chassis ` +
			`or rack cooling. Check nvidia-smi -q -d TEMPERATURE,PERFORMANCE for thermal slowdown; ` +
			`open a hardware ticket for the node if it persists.`,
		cordonedSeverity: SeverityInfo,
	}, {
		name:     "LoomGPUFramebufferNearlyFull",
		severity: SeverityWarning,
		// FB_USED and FB_FREE are both MiB: the ratio needs no conversion.
		expr: fmt.Sprintf(`DCGM_FI_DEV_FB_USED{%[1]s} / (DCGM_FI_DEV_FB_USED{%[1]s} + DCGM_FI_DEV_FB_FREE{%[1]s}) > %[2]g`,
			exporter, FBUsedHighRatio),
		holdFor: FBUsedHighFor,
		summary: `GPU {{ $labels.gpu }} on {{ $labels.node }} has used {{ $value | humanizePercentage }} of its memory.`,
		description: gpuOnNode + migInstance + ` has used {{ $value | humanizePercentage }} of its framebuffer for ` +
			FBUsedHighFor + inPod + `; its next allocation is likely to fail with CUDA out of memory.`,
		runbook: `Tell the owner of the workload: lower its batch size or enable activation checkpointing. ` +
			`A GPU full while nothing is allocated to it holds memory of a process that did not exit: ` +
			`find it with nvidia-smi on the node.`,
		cordonedSeverity: SeverityInfo,
	}}
}

func exporterAlerts() []alert {
	up := `up{` + exporter + `}`
	return []alert{{
		name:     "LoomGPUExporterDown",
		severity: SeverityWarning,
		expr:     up + ` == 0 unless on (node) (` + inDriverUpgrade + ` or ` + cordoned + ` or ` + driverStarting + ` or ` + nodeDown + `)`,
		holdFor:  ExporterDownFor,
		summary:  `dcgm-exporter on {{ $labels.node }} cannot be scraped.`,
		description: `Prometheus has failed to scrape dcgm-exporter on node {{ $labels.node }} ({{ $labels.instance }}) for ` +
			ExporterDownFor + `: the GPU alerts of that node are blind.`,
		runbook: `kubectl get pods -A -l app.kubernetes.io/component=dcgm-exporter --field-selector spec.nodeName={{ $labels.node }}; ` +
			`read its logs and events (DCGM failing to start after a driver change is common; deleting the pod restarts it). ` +
			`A Running pod that cannot be scraped: check NetworkPolicies to port 9400.`,
	}, {
		name:     "LoomGPUExporterAbsent",
		severity: SeverityWarning,
		expr: `absent(` + up + `)
and on ()
(max(loom_clusterpolicy_component_desired_nodes{component="` + gpuv1alpha1.OperandDCGMExporter + `"}) > 0)`,
		holdFor: ExporterAbsentFor,
		summary: `Prometheus scrapes no dcgm-exporter although Loom runs it.`,
		description: `Loom deploys dcgm-exporter on GPU nodes, but Prometheus has had no target of job ` + ExporterJob + ` for ` +
			ExporterAbsentFor + `: no GPU is monitored.`,
		runbook: `Read the status of the ClusterPolicy and of the Prometheus CR: its serviceMonitorSelector must match ` +
			`the labels of the ` + ExporterJob + ` ServiceMonitor (kube-prometheus-stack selects only release: <its release>), ` +
			`and its serviceMonitorNamespaceSelector the ServiceMonitor's namespace. ` +
			`Then check that the Service's endpoints list the dcgm-exporter pods on port gpu-metrics.`,
	}, {
		name:     "LoomGPUMissing",
		severity: SeverityWarning,
		// Nodes whose exporter is up but reports no GPU at all count 0
		// (the "or"); a node whose exporter is down is LoomGPUExporterDown's.
		expr: `(
  sum by (node) (max by (node, product) (loom_gpunode_gpus))
  - on (node)
  (
    ` + RecordNodeGPUs + `
    or on (node)
    (max by (node) (` + up + `) == 1) * 0
  )
  > 0
)
unless on (node) (` + inDriverUpgrade + ` or ` + cordoned + `)`,
		holdFor: GPUMissingFor,
		summary: `{{ $value | printf "%.0f" }} GPU(s) of node {{ $labels.node }} are missing from dcgm-exporter.`,
		description: `The node agent found more GPUs through NVML on node {{ $labels.node }} than dcgm-exporter reports: ` +
			`{{ $value | printf "%.0f" }} missing for ` + GPUMissingFor + `.`,
		runbook: `On the node, compare nvidia-smi -L with the inventory (kubectl get gpunodes {{ $labels.node }} -o yaml) and ` +
			`look for Xid 79 (fallen off the bus) in dmesg: ` + drainNode + ` and reboot it. ` +
			`All GPUs present in nvidia-smi: restart the node's dcgm-exporter pod.`,
	}}
}

func inventoryAlerts() []alert {
	return []alert{{
		name:        "LoomGPUNodeUnhealthyGPUs",
		severity:    SeverityWarning,
		expr:        `max by (node) (loom_gpunode_unhealthy_gpus) > 0 unless on (node) (` + inDriverUpgrade + `)`,
		holdFor:     NodeUnhealthyFor,
		summary:     `Node {{ $labels.node }} has {{ $value | printf "%.0f" }} unhealthy GPU(s).`,
		description: `Loom's node agent marks {{ $value | printf "%.0f" }} GPU(s) of node {{ $labels.node }} Unhealthy; pods are no longer placed on them.`,
		runbook: `kubectl get gpunodes {{ $labels.node }} -o yaml names the GPUs and why; check the node's GPU alerts ` +
			`(Xid, ECC) and dmesg. ` + drainNode + ` and reset the GPUs or reboot it; RMA a GPU that stays unhealthy.`,
		cordonedSeverity: SeverityInfo,
	}, {
		name:     "LoomGPUNodeAgentNotReporting",
		severity: SeverityWarning,
		// The GPUNode says Ready=False (the agent failed to collect; not
		// an agent run unprivileged, which cannot, by configuration), or
		// still says what a gone agent last wrote: no agent of the node is
		// scraped, or its last success is old (its writes refused; an
		// unprivileged agent's success is publishing the PCI bus, so it
		// is told too). The second part waits for some agent to be
		// scraped, so that a PodMonitor no Prometheus selects is
		// LoomGPUNodeAgentAbsent's.
		expr: `(
  (max by (node) (loom_gpunode_ready) == 0 unless on (node) ` + agentUnprivileged + `)
  or
  (
    max by (node) (loom_gpunode_ready)
    unless on (node)
    (time() - max by (node) (` + agentLastSuccess + `) < ` + NodeAgentStaleSeconds + `)
  )
  and on ()
  group(` + agentLastSuccess + `)
)
unless on (node) (` + inDriverUpgrade + ` or ` + cordoned + ` or ` + driverStarting + ` or ` + nodeDown + `)`,
		holdFor: NodeAgentDownFor,
		summary: `Loom's node agent on {{ $labels.node }} is not reporting.`,
		description: `Loom's node agent on node {{ $labels.node }} has not collected the GPU inventory for ` + NodeAgentDownFor +
			` (it failed, its pod is not running or not scraped, or its writes are refused); the node's GPUNode is stale ` +
			`and its GPU health unknown to Loom.`,
		runbook: `kubectl get pods -A -l app.kubernetes.io/component=node-agent --field-selector spec.nodeName={{ $labels.node }}: ` +
			`no pod, read the DaemonSet's events (taints, resources); a pod, read its logs: NVML failing to initialise usually ` +
			`means the driver is not loaded (check the driver pod, lsmod | grep nvidia); API errors, its RBAC or the API server.`,
	}, {
		// Told once for the fleet, at info: a configuration, no fault.
		name:     "LoomGPUNodeAgentUnprivileged",
		severity: SeverityInfo,
		expr:     `count(` + agentUnprivileged + `)`,
		holdFor:  NodeAgentDownFor,
		summary:  `Loom's node agent runs unprivileged on {{ $value | printf "%.0f" }} GPU node(s): their GPU health is not watched.`,
		description: `Loom's node agent on {{ $value | printf "%.0f" }} GPU node(s) runs unprivileged (nodeAgent.privileged=false) ` +
			`without NVIDIA's runtime as the node's default, so it cannot open the GPUs: their GPUNodes list the PCI bus only, ` +
			`no GPU is marked unhealthy and LoomGPUNodeAgentNotReporting leaves them out while the agent publishes.`,
		runbook: `If that is deliberate, nothing to do (route info alerts away). Otherwise set nodeAgent.privileged=true ` +
			`(helm upgrade), or make NVIDIA's container runtime the nodes' default. loom_gpunode_agent_unprivileged names the nodes; ` +
			`kubectl get gpunodes shows NVMLUnavailable with reason Unprivileged.`,
	}, {
		name:     "LoomGPUNodeAgentAbsent",
		severity: SeverityWarning,
		expr: `absent(` + agentLastSuccess + `)
and on ()
(count(loom_gpunode_ready) > 0)`,
		holdFor: NodeAgentAbsentFor,
		summary: `Prometheus scrapes no Loom node agent although GPU nodes have an inventory.`,
		description: `Loom's manager lists GPU nodes, but no node agent has been scraped for ` + NodeAgentAbsentFor +
			`: whether the inventory is current is unknown.`,
		runbook: `kubectl get pods -A -l app.kubernetes.io/component=node-agent: no pods, read the node agent DaemonSet's events. ` +
			`Pods running: read the status of the ClusterPolicy (its Monitoring condition) and of the Prometheus CR: its ` +
			`podMonitorSelector must match the labels of the loom-node-agent PodMonitor, and its podMonitorNamespaceSelector ` +
			`Loom's namespace.`,
	}, {
		name:     "LoomGPUOperandNotReady",
		severity: SeverityWarning,
		// Nodes in a driver upgrade or cordoned for maintenance restart
		// their operands: an operand not ready on such a node is not
		// counted, one not ready on another node is (a node waiting for
		// its jobs, its operands all ready, hides nothing).
		expr: `(
  max by (component) (loom_clusterpolicy_component_desired_nodes)
  - max by (component) (loom_clusterpolicy_component_ready_nodes)
)
- (
  count by (component) (
    max by (node, component) (` + operandNotReady + `)
    and on (node) (` + inDriverUpgrade + ` or ` + cordoned + ` or ` + nodeDown + `)
  )
  or max by (component) (loom_clusterpolicy_component_desired_nodes) * 0
)
> 0`,
		holdFor:     OperandNotReadyFor,
		summary:     `{{ $labels.component }} is not ready on {{ $value | printf "%.0f" }} GPU node(s).`,
		description: `{{ $value | printf "%.0f" }} of the nodes that should run {{ $labels.component }} have had no ready pod of it for ` + OperandNotReadyFor + `.`,
		runbook: `kubectl get clusterpolicy -o yaml shows the component's state; ` + operandNotReady + `{component="{{ $labels.component }}"} ` +
			`names the nodes, and kubectl get pods -A -l app.kubernetes.io/component={{ $labels.component }} -o wide their pods, ` +
			`whose events and logs say why. ` +
			`An operand waits for the driver and the toolkit of its node: fix those first.`,
	}, {
		name:        "LoomGPUDriverUpgradeFailed",
		severity:    SeverityWarning,
		expr:        `max(loom_driver_upgrade_nodes{state="failed"}) > 0`,
		holdFor:     DriverUpgradeFailedFor,
		summary:     `The driver upgrade failed on {{ $value | printf "%.0f" }} node(s).`,
		description: `Loom's driver upgrade failed on {{ $value | printf "%.0f" }} GPU node(s); they stay cordoned and count against maxUnavailable.`,
		runbook: `kubectl get clusterpolicy -o yaml lists the failed nodes; read the driver pod's logs on them ` +
			`(a kernel without matching headers or a GPU still in use are common). Fix, then delete the driver pod to retry.`,
	}}
}

func utilizationAlerts() []alert {
	return []alert{{
		name:     "LoomGPUAllocatedIdle",
		severity: SeverityInfo,
		// A MIG device has no utilisation figure: it is never judged idle.
		expr: fmt.Sprintf(`max_over_time(%s, pod!=""}[%s]) < %d`,
			gpuUtil, IdleWindow, IdleUtilizationPercent),
		holdFor: IdleFor,
		summary: `GPU {{ $labels.gpu }} on {{ $labels.node }} is allocated to {{ $labels.namespace }}/{{ $labels.pod }} but idle.`,
		description: gpuOnNode + ` is allocated to pod {{ $labels.namespace }}/{{ $labels.pod }} but its utilisation has stayed ` +
			fmt.Sprintf(`below %d%% for over %s`, IdleUtilizationPercent, IdleFor) + ` (at most {{ $value | printf "%.1f" }}% lately).`,
		runbook: `Ask the owner of {{ $labels.namespace }}/{{ $labels.pod }}: a notebook left open, a job waiting on input or ` +
			`stuck before its first kernel, or one that finished without exiting. Scale it down or delete it to free the GPU.`,
	}}
}
