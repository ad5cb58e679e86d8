package ruletest

import (
	"time"

	"github.com/loom-dev/loom/controllers/monitoring/assets"
)

// cordonedCases: a node cordoned for maintenance (spec.unschedulable) has
// its GPUs, driver and operands stopped and tested on purpose. The alerts
// that something of the node is gone leave it out; the GPU health alerts
// are one severity lower there, labelled cordoned, so that they are told
// without paging; a schedulable node beside it alerts as always.
var cordonedCases = []alertCase{
	{
		name:  "Xid 79 on a cordoned node and on a schedulable one",
		alert: "LoomGPUXidCritical",
		series: []string{
			gpuA0.with("err_code", "79", "err_msg", "GPU has fallen off the bus").series("DCGM_FI_DEV_XID_ERRORS", "0x2 79x10"),
			gpuB0.with("err_code", "79", "err_msg", "GPU has fallen off the bus").series("DCGM_FI_DEV_XID_ERRORS", "0x2 79x10"),
			cordonedSeries("gpu-a", "1x12"),
		},
		at: 8 * time.Minute,
		want: []map[string]string{
			labelsOf(assets.SeverityWarning, gpuA0.id(), map[string]string{"err_code": "79", "err_msg": "GPU has fallen off the bus", assets.LabelCordoned: "true"}),
			labelsOf(assets.SeverityCritical, gpuB0.id(), map[string]string{"err_code": "79", "err_msg": "GPU has fallen off the bus"}),
		},
		description: []string{"reported Xid 79"},
	},
	{
		// Uncordoned: its series ends, and the alert pages again.
		name:  "Xid 79 on a node uncordoned",
		alert: "LoomGPUXidCritical",
		series: []string{
			gpuA0.with("err_code", "79", "err_msg", "GPU has fallen off the bus").series("DCGM_FI_DEV_XID_ERRORS", "0x2 79x10"),
			cordonedSeries("gpu-a", "1x5 stale"),
		},
		at: 10 * time.Minute,
		want: []map[string]string{
			labelsOf(assets.SeverityCritical, gpuA0.id(), map[string]string{"err_code": "79", "err_msg": "GPU has fallen off the bus"}),
		},
		description: []string{"on node gpu-a reported Xid 79"},
	},
	{
		// A burn-in test heats the GPU and fills its memory.
		name:  "a burn-in on a cordoned node",
		alert: "LoomGPUTemperatureHigh",
		series: []string{
			gpuA0.series("DCGM_FI_DEV_GPU_TEMP", "89x20"), gpuB0.series("DCGM_FI_DEV_GPU_TEMP", "89x20"),
			cordonedSeries("gpu-a", "1x20"),
		},
		at: 20 * time.Minute,
		want: []map[string]string{
			labelsOf(assets.SeverityInfo, gpuA0.id(), map[string]string{assets.LabelCordoned: "true"}),
			labelsOf(assets.SeverityWarning, gpuB0.id()),
		},
		description: []string{"has been above 85 °C for 15m"},
	},
	{
		name:  "unhealthy GPUs on a cordoned node",
		alert: "LoomGPUNodeUnhealthyGPUs",
		series: []string{
			loomSeries("loom_gpunode_unhealthy_gpus", `node="gpu-a"`, "2x20"), cordonedSeries("gpu-a", "1x20"),
		},
		at:          20 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityInfo, "node": "gpu-a", assets.LabelCordoned: "true"}},
		description: []string{"marks 2 GPU(s) of node gpu-a Unhealthy"},
	},
	{
		name:  "an exporter stopped on a cordoned node",
		alert: "LoomGPUExporterDown",
		series: []string{
			upSeries("gpu-a", "0x20"), cordonedSeries("gpu-a", "1x20"),
			upSeries("gpu-b", "0x20"),
		},
		at:          20 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "job": assets.ExporterJob, "instance": "10.1.0.b:9400", "node": "gpu-b", "service": assets.ExporterJob, "endpoint": "gpu-metrics"}},
		description: []string{"dcgm-exporter on node gpu-b"},
	},
	{
		name:  "the agent fails on a cordoned node",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "0x25"), cordonedSeries("gpu-a", "1x25"),
			loomSeries("loom_gpunode_ready", `node="gpu-b"`, "0x25"), agentSeries("gpu-b", "0+60x25"),
		},
		at:          20 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-b"}},
		description: []string{"node agent on node gpu-b has not collected"},
	},
	{
		name:  "GPUs taken out of a cordoned node",
		alert: "LoomGPUMissing",
		series: append(sevenOfEight(),
			upSeries("gpu-a", "1x20"), cordonedSeries("gpu-a", "1x20"),
			loomSeries("loom_gpunode_gpus", `node="gpu-a", product="NVIDIA-H100-80GB-HBM3"`, "8x20")),
		at: 20 * time.Minute,
	},
	{
		name:  "the driver stopped on a cordoned node",
		alert: "LoomGPUOperandNotReady",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="driver"`, "4x40"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="driver"`, "4x2 3x38"),
			cordonedSeries("gpu-a", "1x40"),
			operandSeries("gpu-a", "driver", "1x2 0x38"), operandSeries("gpu-b", "driver", "1x40"),
		},
		at: 40 * time.Minute,
	},
}

// unprivilegedCases: an agent run unprivileged (nodeAgent.privileged=false)
// cannot read its GPUs by configuration: its GPUNode's Ready is False, its
// node is no agent failing but one info alert for the fleet; an agent of
// such a node that stops publishing is still told.
var unprivilegedCases = []alertCase{
	{
		name:  "every agent runs unprivileged",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "0x25"), unprivilegedSeries("gpu-a", "1x25"), agentSeries("gpu-a", "0+60x25"),
			loomSeries("loom_gpunode_ready", `node="gpu-b"`, "0x25"), unprivilegedSeries("gpu-b", "1x25"), agentSeries("gpu-b", "0+60x25"),
		},
		at: 25 * time.Minute,
	},
	{
		name:  "an unprivileged agent stops",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "0x25"), unprivilegedSeries("gpu-a", "1x25"), agentSeries("gpu-a", "0+60x3"),
			loomSeries("loom_gpunode_ready", `node="gpu-b"`, "0x25"), unprivilegedSeries("gpu-b", "1x25"), agentSeries("gpu-b", "0+60x25"),
		},
		at:          25 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-a"}},
		description: []string{"node agent on node gpu-a has not collected"},
	},
	{
		name:  "one agent fails beside unprivileged ones",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "0x25"), unprivilegedSeries("gpu-a", "1x25"), agentSeries("gpu-a", "0+60x25"),
			loomSeries("loom_gpunode_ready", `node="gpu-b"`, "0x25"), agentSeries("gpu-b", "0+60x25"),
		},
		at:          25 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-b"}},
		description: []string{"node agent on node gpu-b has not collected"},
	},
	{
		name:  "agents unprivileged on two nodes",
		alert: "LoomGPUNodeAgentUnprivileged",
		series: []string{
			unprivilegedSeries("gpu-a", "1x25"), unprivilegedSeries("gpu-b", "1x25"),
			loomSeries("loom_gpunode_ready", `node="gpu-c"`, "1x25"),
		},
		at:          25 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityInfo}},
		description: []string{"on 2 GPU node(s) runs unprivileged (nodeAgent.privileged=false)"},
	},
	{
		name:   "privileged agents",
		alert:  "LoomGPUNodeAgentUnprivileged",
		series: []string{loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1x25")},
		at:     25 * time.Minute,
	},
}
