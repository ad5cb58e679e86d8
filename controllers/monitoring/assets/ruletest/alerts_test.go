package ruletest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-dev/loom/controllers/monitoring/assets"
)

type alertCase struct {
	name  string
	alert string
	// series are load lines, a sample per minute from 0.
	series []string
	// at is the last evaluation, where the alerts are read.
	at time.Duration
	// want are the label sets of the firing alerts (alertname left out);
	// none: the alert stays quiet.
	want []map[string]string
	// description has these parts (of the first alert).
	description []string
}

var (
	gpuA0 = gpu{node: "gpu-a", index: 0}
	gpuA1 = gpu{node: "gpu-a", index: 1}
	gpuB0 = gpu{node: "gpu-b", index: 0}
)

func labelsOf(severity string, ms ...map[string]string) map[string]string {
	return merge(append(ms, map[string]string{"severity": severity})...)
}

// sevenOfEight is node gpu-a's exporter reporting GPUs 0-6 only.
func sevenOfEight() []string {
	var out []string
	for i := range 7 {
		g := gpu{node: "gpu-a", index: i}
		out = append(out, g.series("DCGM_FI_DEV_FB_USED", "0x20"), g.series("DCGM_FI_DEV_GPU_TEMP", "40x20"))
	}
	return out
}

var alertCases = []alertCase{
	// Xids that need a reset.
	{
		name:  "Xid 79 (dcgm-exporter labels err_code: a new series)",
		alert: "LoomGPUXidCritical",
		series: []string{
			gpuA0.with("err_code", "0", "err_msg", "No Error").series("DCGM_FI_DEV_XID_ERRORS", "0x5"),
			gpuA0.with("err_code", "79", "err_msg", "GPU has fallen off the bus").series("DCGM_FI_DEV_XID_ERRORS", "_x5 79x20"),
			gpuA1.with("err_code", "0", "err_msg", "No Error").series("DCGM_FI_DEV_XID_ERRORS", "0x20"),
		},
		at: 8 * time.Minute,
		want: []map[string]string{labelsOf(assets.SeverityCritical, gpuA0.id(),
			map[string]string{"err_code": "79", "err_msg": "GPU has fallen off the bus"})},
		description: []string{"GPU 0 (" + modelName + ", GPU-gpu-a-0) on node gpu-a reported Xid 79 (GPU has fallen off the bus)."},
	},
	{
		name:        "Xid 48 on an allocated GPU (an exporter without err_code)",
		alert:       "LoomGPUXidCritical",
		series:      []string{gpuA0.allocated("team-a", "train-worker-0").series("DCGM_FI_DEV_XID_ERRORS", "0x5 48x20")},
		at:          20 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityCritical, gpuA0.id(), map[string]string{"namespace": "team-a", "pod": "train-worker-0"})},
		description: []string{"reported Xid 48 (pod team-a/train-worker-0)."},
	},
	{
		name:   "an application's Xid is no reset",
		alert:  "LoomGPUXidCritical",
		series: []string{gpuA0.series("DCGM_FI_DEV_XID_ERRORS", "0x5 31x10")},
		at:     10 * time.Minute,
	},
	{
		name:   "no Xid",
		alert:  "LoomGPUXidCritical",
		series: []string{gpuA0.series("DCGM_FI_DEV_XID_ERRORS", "0x20")},
		at:     20 * time.Minute,
	},

	// Other Xids, while new.
	{
		name:        "Xid 31 changes the value",
		alert:       "LoomGPUXidError",
		series:      []string{gpuA0.allocated("team-a", "train-worker-0").series("DCGM_FI_DEV_XID_ERRORS", "0x15 31x20")},
		at:          20 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityWarning, gpuA0.id(), map[string]string{"namespace": "team-a", "pod": "train-worker-0"})},
		description: []string{"reported Xid 31 (pod team-a/train-worker-0) in the last 10m."},
	},
	{
		name:  "Xid 43 as a new err_code series",
		alert: "LoomGPUXidError",
		series: []string{
			gpuA0.with("err_code", "0", "err_msg", "No Error").series("DCGM_FI_DEV_XID_ERRORS", "0x20"),
			gpuA0.with("err_code", "43", "err_msg", "GPU stopped processing").series("DCGM_FI_DEV_XID_ERRORS", "_x20 43x10"),
		},
		at:          22 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityWarning, gpuA0.id(), map[string]string{"err_code": "43", "err_msg": "GPU stopped processing"})},
		description: []string{"reported Xid 43 (GPU stopped processing) in the last 10m."},
	},
	{
		name:   "the same Xid 10 minutes later no longer alerts",
		alert:  "LoomGPUXidError",
		series: []string{gpuA0.series("DCGM_FI_DEV_XID_ERRORS", "0x5 31x40")},
		at:     30 * time.Minute,
	},
	{
		// dcgm-exporter keeps a GPU's last Xid, and labels every series of
		// the GPU with the pod that has it: when the GPU goes to another
		// pod, the same old Xid appears in a series of new labels. That is
		// no new Xid, and the new pod did not cause it.
		name:  "an old Xid is not new when the GPU goes to another pod",
		alert: "LoomGPUXidError",
		series: []string{
			gpuA0.allocated("team-a", "train-worker-0").series("DCGM_FI_DEV_XID_ERRORS", "0x2 31x17"),
			gpuA0.allocated("team-b", "infer-0").series("DCGM_FI_DEV_XID_ERRORS", "_x20 31x15"),
		},
		at: 26 * time.Minute,
	},
	{
		name:  "a new Xid on the GPU's next pod alerts",
		alert: "LoomGPUXidError",
		series: []string{
			gpuA0.allocated("team-a", "train-worker-0").series("DCGM_FI_DEV_XID_ERRORS", "0x2 31x17"),
			gpuA0.allocated("team-b", "infer-0").series("DCGM_FI_DEV_XID_ERRORS", "_x20 31x3 43x12"),
		},
		at:          26 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityWarning, gpuA0.id(), map[string]string{"namespace": "team-b", "pod": "infer-0"})},
		description: []string{"reported Xid 43 (pod team-b/infer-0)"},
	},
	{
		// dcgm-exporter keeps the GPU's last Xid: after Prometheus was
		// down (or the exporter unscraped) longer than the window, it has
		// nothing to compare it with, and it is not new.
		name:   "an old Xid after a gap in Prometheus's samples",
		alert:  "LoomGPUXidError",
		series: []string{gpuA0.series("DCGM_FI_DEV_XID_ERRORS", "31x10 _x15 31x10"), gpuA1.series("DCGM_FI_DEV_XID_ERRORS", "0x10 _x15 0x10")},
		at:     28 * time.Minute,
	},
	{
		// Xid 43 at 30m, 4 minutes after the gap: told once the window
		// has samples (dcgm-exporter keeps it meanwhile).
		name:  "a new Xid after a gap in Prometheus's samples",
		alert: "LoomGPUXidError",
		series: []string{
			gpuA0.series("DCGM_FI_DEV_XID_ERRORS", "0x10 _x15 0x3 43x12"),
		},
		at:          38 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityWarning, gpuA0.id())},
		description: []string{"reported Xid 43 in the last 10m."},
	},
	{
		name:   "a critical Xid is LoomGPUXidCritical's",
		alert:  "LoomGPUXidError",
		series: []string{gpuA0.series("DCGM_FI_DEV_XID_ERRORS", "0x15 79x10")},
		at:     20 * time.Minute,
	},

	// ECC and row remapping.
	{
		name:  "double-bit errors on a GPU split by MIG alert once",
		alert: "LoomGPUUncorrectableECCErrors",
		series: []string{
			gpuA0.mig(1).series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0x10 1x10"),
			gpuA0.mig(2).allocated("team-b", "infer-0").series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0x10 1x10"),
			gpuA1.series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0x20"),
		},
		at:          12 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityCritical, gpuA0.id())},
		description: []string{"on node gpu-a had 1 uncorrectable (double-bit) ECC error(s) in the last 10m"},
	},
	{
		name:   "old errors, none new",
		alert:  "LoomGPUUncorrectableECCErrors",
		series: []string{gpuA0.series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "3x30")},
		at:     30 * time.Minute,
	},
	{
		name:        "remapping failed",
		alert:       "LoomGPURowRemapFailure",
		series:      []string{gpuA0.series("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0x5 1x5")},
		at:          8 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityCritical, gpuA0.id())},
		description: []string{"GPU 0 (" + modelName + ", GPU-gpu-a-0) on node gpu-a has no spare memory rows"},
	},
	{
		name:   "remapping works",
		alert:  "LoomGPURowRemapFailure",
		series: []string{gpuA0.series("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0x20")},
		at:     20 * time.Minute,
	},
	{
		name:        "a remap waits for a reset",
		alert:       "LoomGPURowRemapPending",
		series:      []string{gpuA0.series("DCGM_FI_DEV_ROW_REMAP_PENDING", "0x2 1x10")},
		at:          8 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityWarning, gpuA0.id())},
		description: []string{"has a memory row remap pending for 5m"},
	},
	{
		name:   "a reset applied the remap within 5 minutes",
		alert:  "LoomGPURowRemapPending",
		series: []string{gpuA0.series("DCGM_FI_DEV_ROW_REMAP_PENDING", "0x2 1x3 0x10")},
		at:     12 * time.Minute,
	},

	// Temperature and memory.
	{
		name:  "hot for 15 minutes",
		alert: "LoomGPUTemperatureHigh",
		series: []string{
			gpuA0.series("DCGM_FI_DEV_GPU_TEMP", "70x2 90x20"),
			gpuA1.series("DCGM_FI_DEV_GPU_TEMP", "70x22"),
		},
		at:          18 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityWarning, gpuA0.id())},
		description: []string{"has been above 85 °C for 15m (now 90 °C)."},
	},
	{
		name:   "a 14-minute burst",
		alert:  "LoomGPUTemperatureHigh",
		series: []string{gpuA0.series("DCGM_FI_DEV_GPU_TEMP", "70x2 90x13 70x10")},
		at:     25 * time.Minute,
	},
	{
		name:  "an allocated MIG device's framebuffer nearly full",
		alert: "LoomGPUFramebufferNearlyFull",
		series: []string{
			gpuA0.mig(3).allocated("team-a", "train-master-0").series("DCGM_FI_DEV_FB_USED", "78000x20"),
			gpuA0.mig(3).allocated("team-a", "train-master-0").series("DCGM_FI_DEV_FB_FREE", "1000x20"),
			gpuA1.series("DCGM_FI_DEV_FB_USED", "40000x20"),
			gpuA1.series("DCGM_FI_DEV_FB_FREE", "40000x20"),
		},
		at:   16 * time.Minute,
		want: []map[string]string{labelsOf(assets.SeverityWarning, gpuA0.mig(3).allocated("team-a", "train-master-0").labels())},
		description: []string{
			"on node gpu-a (MIG instance 3, 1g.10gb) has used 98.73% of its framebuffer for 15m (pod team-a/train-master-0);",
		},
	},
	{
		name:  "87.5% used",
		alert: "LoomGPUFramebufferNearlyFull",
		series: []string{
			gpuA0.series("DCGM_FI_DEV_FB_USED", "70000x20"),
			gpuA0.series("DCGM_FI_DEV_FB_FREE", "10000x20"),
		},
		at: 20 * time.Minute,
	},

	// dcgm-exporter.
	{
		name:        "one exporter cannot be scraped",
		alert:       "LoomGPUExporterDown",
		series:      []string{upSeries("gpu-a", "0x15"), upSeries("gpu-b", "1x15")},
		at:          11 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "job": assets.ExporterJob, "instance": "10.1.0.a:9400", "node": "gpu-a", "service": assets.ExporterJob, "endpoint": "gpu-metrics"}},
		description: []string{"dcgm-exporter on node gpu-a (10.1.0.a:9400) for 10m"},
	},
	{
		// Its driver restarted under it: DCGM fails until the new one
		// is validated, an operand restart the node's upgrade waits for.
		name:   "an exporter on a node in its driver upgrade",
		alert:  "LoomGPUExporterDown",
		series: []string{upSeries("gpu-a", "0x20"), upgradingSeries("gpu-a", "1x20")},
		at:     20 * time.Minute,
	},
	{
		// A new node's first driver build (the kernel module compiled):
		// dcgm-exporter waits for the driver, its pod's IP unanswered.
		name:  "an exporter on a node whose driver is building",
		alert: "LoomGPUExporterDown",
		series: []string{
			upSeries("gpu-a", "0x20"), operandSeries("gpu-a", "driver", "0x20"),
			upSeries("gpu-b", "0x20"), operandSeries("gpu-b", "driver", "1x20"),
		},
		at:          20 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "job": assets.ExporterJob, "instance": "10.1.0.b:9400", "node": "gpu-b", "service": assets.ExporterJob, "endpoint": "gpu-metrics"}},
		description: []string{"dcgm-exporter on node gpu-b (10.1.0.b:9400) for 10m"},
	},
	{
		// gpu-a is powered off: KubeNodeNotReady's.
		name:  "an exporter on a node that is down",
		alert: "LoomGPUExporterDown",
		series: []string{
			upSeries("gpu-a", "0x20"), loomSeries("loom_gpunode_node_ready", `node="gpu-a"`, "0x20"),
			upSeries("gpu-b", "0x20"), loomSeries("loom_gpunode_node_ready", `node="gpu-b"`, "1x20"),
		},
		at:          20 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "job": assets.ExporterJob, "instance": "10.1.0.b:9400", "node": "gpu-b", "service": assets.ExporterJob, "endpoint": "gpu-metrics"}},
		description: []string{"dcgm-exporter on node gpu-b (10.1.0.b:9400) for 10m"},
	},
	{
		name:   "a restart",
		alert:  "LoomGPUExporterDown",
		series: []string{upSeries("gpu-a", "0x5 1x10")},
		at:     15 * time.Minute,
	},
	{
		name:        "no target although Loom deploys it",
		alert:       "LoomGPUExporterAbsent",
		series:      []string{loomSeries("loom_clusterpolicy_component_desired_nodes", `component="dcgm-exporter"`, "3x20")},
		at:          16 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "job": assets.ExporterJob}},
		description: []string{"no target of job loom-dcgm-exporter for 15m"},
	},
	{
		name: "scraped",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="dcgm-exporter"`, "3x20"),
			upSeries("gpu-a", "1x20"),
		},
		alert: "LoomGPUExporterAbsent",
		at:    20 * time.Minute,
	},
	{
		name: "no GPU nodes, so no exporter",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="dcgm-exporter"`, "0x20"),
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="driver"`, "2x20"),
		},
		alert: "LoomGPUExporterAbsent",
		at:    20 * time.Minute,
	},
	{
		name:  "seven of eight GPUs report",
		alert: "LoomGPUMissing",
		series: append(sevenOfEight(),
			upSeries("gpu-a", "1x20"),
			loomSeries("loom_gpunode_gpus", `node="gpu-a", product="NVIDIA-H100-80GB-HBM3"`, "8x20")),
		at:          16 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-a"}},
		description: []string{"on node gpu-a than dcgm-exporter reports: 1 missing for 15m."},
	},
	{
		name:  "the exporter is up but reports no GPU",
		alert: "LoomGPUMissing",
		series: []string{
			upSeries("gpu-b", "1x20"),
			loomSeries("loom_gpunode_gpus", `node="gpu-b", product="NVIDIA-H100-80GB-HBM3"`, "2x20"),
		},
		at:          16 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-b"}},
		description: []string{"2 missing"},
	},
	{
		name:  "MIG instances of one GPU are one GPU",
		alert: "LoomGPUMissing",
		series: []string{
			gpuA0.mig(1).series("DCGM_FI_DEV_FB_USED", "0x20"),
			gpuA0.mig(2).series("DCGM_FI_DEV_FB_USED", "0x20"),
			gpuA0.series("DCGM_FI_DEV_GPU_TEMP", "40x20"),
			gpuA1.mig(1).series("DCGM_FI_DEV_FB_USED", "0x20"),
			upSeries("gpu-a", "1x20"),
			loomSeries("loom_gpunode_gpus", `node="gpu-a", product="NVIDIA-A100-SXM4-80GB"`, "2x20"),
		},
		at: 20 * time.Minute,
	},
	{
		name:  "GPUs missing on a node in its driver upgrade",
		alert: "LoomGPUMissing",
		series: append(sevenOfEight(),
			upSeries("gpu-a", "1x20"), upgradingSeries("gpu-a", "1x20"),
			loomSeries("loom_gpunode_gpus", `node="gpu-a", product="NVIDIA-H100-80GB-HBM3"`, "8x20")),
		at: 20 * time.Minute,
	},
	{
		name:  "an exporter that is down is LoomGPUExporterDown's",
		alert: "LoomGPUMissing",
		series: []string{
			upSeries("gpu-a", "0x20"),
			loomSeries("loom_gpunode_gpus", `node="gpu-a", product="NVIDIA-H100-80GB-HBM3"`, "8x20"),
		},
		at: 20 * time.Minute,
	},

	// Loom's inventory.
	{
		name:  "two unhealthy GPUs (two manager replicas report them)",
		alert: "LoomGPUNodeUnhealthyGPUs",
		series: []string{
			loomSeries("loom_gpunode_unhealthy_gpus", `node="gpu-a"`, "0x2 2x10"),
			`loom_gpunode_unhealthy_gpus{job="loom-manager", instance="10.0.0.3:8080", node="gpu-a"} 0x2 2x10`,
			loomSeries("loom_gpunode_unhealthy_gpus", `node="gpu-b"`, "0x12"),
		},
		at:          8 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-a"}},
		description: []string{"marks 2 GPU(s) of node gpu-a Unhealthy"},
	},
	{
		name:   "unhealthy GPUs on a node in its driver upgrade",
		alert:  "LoomGPUNodeUnhealthyGPUs",
		series: []string{loomSeries("loom_gpunode_unhealthy_gpus", `node="gpu-a"`, "2x20"), upgradingSeries("gpu-a", "1x20")},
		at:     20 * time.Minute,
	},
	{
		name:   "all healthy",
		alert:  "LoomGPUNodeUnhealthyGPUs",
		series: []string{loomSeries("loom_gpunode_unhealthy_gpus", `node="gpu-a"`, "0x12")},
		at:     12 * time.Minute,
	},
	{
		name:        "the agent fails to collect",
		alert:       "LoomGPUNodeAgentNotReporting",
		series:      []string{loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1 0x15"), loomSeries("loom_gpunode_ready", `node="gpu-b"`, "1x16")},
		at:          12 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-a"}},
		description: []string{"node agent on node gpu-a has not collected the GPU inventory for 10m"},
	},
	{
		// NVML fails while the driver is unloaded, built and validated:
		// longer than 10 minutes on a slow kernel build.
		name:  "the agent of a node in its driver upgrade",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1 0x25"), upgradingSeries("gpu-a", "0 1x25"),
			loomSeries("loom_gpunode_ready", `node="gpu-b"`, "1x26"), upgradingSeries("gpu-b", "0x26"),
			agentSeries("gpu-a", "0+60x26"), agentSeries("gpu-b", "0+60x26"),
		},
		at: 25 * time.Minute,
	},
	{
		name:  "the agent still fails after the node's driver upgrade",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1 0x30"), upgradingSeries("gpu-a", "0 1x15 0x15"),
			agentSeries("gpu-a", "0+60x30"),
		},
		at:          28 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-a"}},
		description: []string{"node agent on node gpu-a has not collected the GPU inventory for 10m"},
	},
	{
		// A new node's first driver build takes over ten minutes: NVML
		// fails until the module is loaded.
		name:  "the agent of a node whose driver is building",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "0x25"), operandSeries("gpu-a", "driver", "0x25"),
			loomSeries("loom_gpunode_ready", `node="gpu-b"`, "1x25"), operandSeries("gpu-b", "driver", "1x25"),
			agentSeries("gpu-b", "0+60x25"),
		},
		at: 25 * time.Minute,
	},
	{
		name:  "the driver is ready, the agent still fails",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "0x25"), operandSeries("gpu-a", "driver", "0x5 1x20"),
			loomSeries("loom_gpunode_ready", `node="gpu-b"`, "1x25"), operandSeries("gpu-b", "driver", "1x25"),
			agentSeries("gpu-b", "0+60x25"),
		},
		at:          17 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-a"}},
		description: []string{"node agent on node gpu-a has not collected the GPU inventory for 10m"},
	},
	{
		// The host's own driver: no driver pod of Loom's says anything.
		name:  "the agent of a node with the host's driver fails",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "0x25"), operandSeries("gpu-a", "device-plugin", "0x25"),
			agentSeries("gpu-a", "0+60x25"),
		},
		at:          12 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-a"}},
		description: []string{"node agent on node gpu-a has not collected the GPU inventory for 10m"},
	},
	{
		// Rebooted for maintenance, or powered off: the agent's pod is
		// not scraped while the node is NotReady.
		name:  "the agent of a node that is down",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1x25"), loomSeries("loom_gpunode_node_ready", `node="gpu-a"`, "1x3 0x22"),
			loomSeries("loom_gpunode_ready", `node="gpu-b"`, "1x25"), loomSeries("loom_gpunode_node_ready", `node="gpu-b"`, "1x25"),
			agentSeries("gpu-a", "0+60x3"), agentSeries("gpu-b", "0+60x25"),
		},
		at: 20 * time.Minute,
	},
	{
		name:   "one failed collection",
		alert:  "LoomGPUNodeAgentNotReporting",
		series: []string{loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1x5 0x5 1 0x5")},
		at:     16 * time.Minute,
	},
	{
		// The GPUNode keeps the Ready its agent last wrote: an agent
		// evicted, crash-looping or never placed writes nothing more.
		name:  "the agent's pod is gone",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1x25"), loomSeries("loom_gpunode_ready", `node="gpu-b"`, "1x25"),
			agentSeries("gpu-a", "0+60x3"), agentSeries("gpu-b", "0+60x25"),
		},
		at:          20 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-a"}},
		description: []string{"node agent on node gpu-a has not collected the GPU inventory for"},
	},
	{
		// Running and scraped, but no collection succeeds (its writes
		// refused): the GPUNode still says Ready.
		name:  "the agent's last success gets old",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1x25"), loomSeries("loom_gpunode_ready", `node="gpu-b"`, "1x25"),
			agentSeries("gpu-a", "0+60x4 240x21"), agentSeries("gpu-b", "0+60x25"),
		},
		at:          22 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "node": "gpu-a"}},
		description: []string{"node agent on node gpu-a has not collected the GPU inventory for"},
	},
	{
		name:  "the agent restarts",
		alert: "LoomGPUNodeAgentNotReporting",
		series: []string{
			loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1x25"),
			agentSeries("gpu-a", "0+60x5 _x3 480+60x17"),
		},
		at: 25 * time.Minute,
	},
	{
		// Not one agent scraped is LoomGPUNodeAgentAbsent's: the
		// PodMonitor unselected would make every node alert here.
		name:   "no agent is scraped",
		alert:  "LoomGPUNodeAgentNotReporting",
		series: []string{loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1x25"), loomSeries("loom_gpunode_ready", `node="gpu-b"`, "1x25")},
		at:     25 * time.Minute,
	},
	{
		name:        "no agent is scraped, though GPU nodes report",
		alert:       "LoomGPUNodeAgentAbsent",
		series:      []string{loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1x25")},
		at:          25 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning}},
		description: []string{"no node agent has been scraped for 15m"},
	},
	{
		name:   "agents are scraped",
		alert:  "LoomGPUNodeAgentAbsent",
		series: []string{loomSeries("loom_gpunode_ready", `node="gpu-a"`, "1x25"), agentSeries("gpu-a", "0+60x25")},
		at:     25 * time.Minute,
	},
	{
		name:  "the driver is not ready on one of four nodes",
		alert: "LoomGPUOperandNotReady",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="driver"`, "4x40"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="driver"`, "4x2 3x38"),
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="dcgm-exporter"`, "4x40"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="dcgm-exporter"`, "4x40"),
		},
		at:          33 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "component": "driver"}},
		description: []string{"1 of the nodes that should run driver have had no ready pod of it for 30m."},
	},
	{
		name:  "a rollout that takes 20 minutes",
		alert: "LoomGPUOperandNotReady",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="driver"`, "4x40"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="driver"`, "4x2 3x20 4x18"),
		},
		at: 40 * time.Minute,
	},
	{
		// maxUnavailable 1 over four nodes: one node's operands restart
		// at a time, for an hour.
		name:  "a driver upgrade rolls through the nodes",
		alert: "LoomGPUOperandNotReady",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="driver"`, "4x60"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="driver"`, "4x2 3x58"),
			upgradingSeries("gpu-a", "0x2 1x15 0x43"), upgradingSeries("gpu-b", "0x17 1x15 0x28"),
			upgradingSeries("gpu-c", "0x32 1x15 0x13"), upgradingSeries("gpu-d", "0x47 1x13"),
			operandSeries("gpu-a", "driver", "1x2 0x15 1x43"), operandSeries("gpu-b", "driver", "1x17 0x15 1x28"),
			operandSeries("gpu-c", "driver", "1x32 0x15 1x13"), operandSeries("gpu-d", "driver", "1x47 0x13"),
		},
		at: 60 * time.Minute,
	},
	{
		name:  "a node not ready besides the one in its driver upgrade",
		alert: "LoomGPUOperandNotReady",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="driver"`, "4x40"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="driver"`, "4x2 2x38"),
			upgradingSeries("gpu-a", "0x2 1x38"), upgradingSeries("gpu-b", "0x40"),
			operandSeries("gpu-a", "driver", "1x2 0x38"), operandSeries("gpu-b", "driver", "1x2 0x38"),
		},
		at:          35 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "component": "driver"}},
		description: []string{"1 of the nodes that should run driver have had no ready pod of it for 30m"},
	},
	{
		// gpu-a waits for its jobs to finish (wait-for-jobs-required), its
		// operands all ready: it hides nothing of gpu-b's fault.
		name:  "a node waiting for its jobs in its upgrade, the device plugin down on another",
		alert: "LoomGPUOperandNotReady",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="device-plugin"`, "4x40"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="device-plugin"`, "4x2 3x38"),
			upgradingSeries("gpu-a", "0x2 1x38"), upgradingSeries("gpu-b", "0x40"),
			operandSeries("gpu-a", "device-plugin", "1x40"), operandSeries("gpu-b", "device-plugin", "1x2 0x38"),
		},
		at:          35 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning, "component": "device-plugin"}},
		description: []string{"1 of the nodes that should run device-plugin have had no ready pod of it for 30m"},
	},
	{
		// Its driver and the operands waiting for it restart: each is
		// left out for that node only.
		name:  "the operands restart only on the node in its upgrade",
		alert: "LoomGPUOperandNotReady",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="driver"`, "4x40"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="driver"`, "4x2 3x38"),
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="device-plugin"`, "4x40"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="device-plugin"`, "4x2 3x38"),
			upgradingSeries("gpu-a", "0x2 1x38"), upgradingSeries("gpu-b", "0x40"),
			operandSeries("gpu-a", "driver", "1x2 0x38"), operandSeries("gpu-a", "device-plugin", "1x2 0x38"),
			operandSeries("gpu-b", "driver", "1x40"), operandSeries("gpu-b", "device-plugin", "1x40"),
		},
		at: 40 * time.Minute,
	},
	{
		name:  "the operands of a node that is down",
		alert: "LoomGPUOperandNotReady",
		series: []string{
			loomSeries("loom_clusterpolicy_component_desired_nodes", `component="driver"`, "4x40"),
			loomSeries("loom_clusterpolicy_component_ready_nodes", `component="driver"`, "4x2 3x38"),
			loomSeries("loom_gpunode_node_ready", `node="gpu-a"`, "1x2 0x38"), loomSeries("loom_gpunode_node_ready", `node="gpu-b"`, "1x40"),
			operandSeries("gpu-a", "driver", "1x2 0x38"), operandSeries("gpu-b", "driver", "1x40"),
		},
		at: 40 * time.Minute,
	},
	{
		name:  "an upgrade failed on one node",
		alert: "LoomGPUDriverUpgradeFailed",
		series: []string{
			loomSeries("loom_driver_upgrade_nodes", `state="failed"`, "0 1x10"),
			loomSeries("loom_driver_upgrade_nodes", `state="in_progress"`, "2x10"),
		},
		at:          7 * time.Minute,
		want:        []map[string]string{{"severity": assets.SeverityWarning}},
		description: []string{"failed on 1 GPU node(s)"},
	},
	{
		name:   "upgrades in progress",
		alert:  "LoomGPUDriverUpgradeFailed",
		series: []string{loomSeries("loom_driver_upgrade_nodes", `state="failed"`, "0x10"), loomSeries("loom_driver_upgrade_nodes", `state="in_progress"`, "2x10")},
		at:     10 * time.Minute,
	},

	// Waste.
	{
		name:  "an allocated GPU idle for an hour",
		alert: "LoomGPUAllocatedIdle",
		series: []string{
			gpuA0.allocated("team-a", "notebook-0").series("DCGM_FI_DEV_GPU_UTIL", "0x70"),
			gpuA1.allocated("team-a", "train-worker-0").series("DCGM_FI_DEV_GPU_UTIL", "90x70"),
		},
		at:          61 * time.Minute,
		want:        []map[string]string{labelsOf(assets.SeverityInfo, gpuA0.allocated("team-a", "notebook-0").labels())},
		description: []string{"is allocated to pod team-a/notebook-0 but its utilisation has stayed below 1% for over 1h (at most 0.0% lately)."},
	},
	{
		name:   "busy once in the hour",
		alert:  "LoomGPUAllocatedIdle",
		series: []string{gpuA0.allocated("team-a", "notebook-0").series("DCGM_FI_DEV_GPU_UTIL", "0x40 80 0x40")},
		at:     75 * time.Minute,
	},
	{
		name:   "a free GPU is idle by right",
		alert:  "LoomGPUAllocatedIdle",
		series: []string{gpuB0.series("DCGM_FI_DEV_GPU_UTIL", "0x70")},
		at:     70 * time.Minute,
	},
	{
		// dcgm-exporter reports DCGM_FI_DEV_GPU_UTIL 0 for a MIG device,
		// however busy: it says nothing of the device's use.
		name:   "an allocated MIG device reads 0",
		alert:  "LoomGPUAllocatedIdle",
		series: []string{gpuA0.mig(1).allocated("team-a", "train-worker-0").series("DCGM_FI_DEV_GPU_UTIL", "0x70")},
		at:     70 * time.Minute,
	},
	{
		name:   "idle for 50 minutes",
		alert:  "LoomGPUAllocatedIdle",
		series: []string{gpuA0.allocated("team-a", "notebook-0").series("DCGM_FI_DEV_GPU_UTIL", "0x50")},
		at:     50 * time.Minute,
	},
}

func allCases() []alertCase {
	return slices.Concat(alertCases, cordonedCases, unprivilegedCases)
}

func TestAlerts(t *testing.T) {
	t.Parallel()
	for _, tc := range allCases() {
		t.Run(tc.alert+"/"+tc.name, func(t *testing.T) {
			t.Parallel()
			e := evaluate(t, tc.series, tc.at)
			firing := e.firing(tc.alert)
			var got []map[string]string
			for _, a := range firing {
				got = append(got, a.Labels.Map())
			}
			var want []map[string]string
			for _, w := range tc.want {
				want = append(want, merge(w, map[string]string{"alertname": tc.alert}))
			}
			sortLabelSets(got)
			sortLabelSets(want)
			if !slices.EqualFunc(got, want, maps.Equal) {
				t.Fatalf("firing at %v:\n got %v\nwant %v", tc.at, got, want)
			}
			for _, a := range firing {
				for _, key := range []string{"summary", "description", "runbook"} {
					text := a.Annotations.Get(key)
					if text == "" || strings.Contains(text, "<error expanding template") || strings.Contains(text, "<no value>") ||
						strings.Contains(text, "{{") {
						t.Errorf("%s: %q", key, text)
					}
				}
			}
			if len(firing) > 0 {
				desc := firing[0].Annotations.Get("description")
				for _, part := range tc.description {
					if !strings.Contains(desc, part) {
						t.Errorf("description %q\nlacks %q", desc, part)
					}
				}
			}
		})
	}
}

// Every alert has a case where it fires and one where it stays quiet.
func TestEveryAlertHasCases(t *testing.T) {
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range allCases() {
		if len(tc.want) > 0 {
			fires[tc.alert] = true
			if len(tc.description) == 0 {
				t.Errorf("%s/%s checks nothing of the description", tc.alert, tc.name)
			}
		} else {
			quiet[tc.alert] = true
		}
	}
	for _, g := range assets.GPURules().Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && (!fires[r.Alert] || !quiet[r.Alert]) {
				t.Errorf("%s: a case where it fires: %v, one where it is quiet: %v", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
}

func sortLabelSets(ls []map[string]string) {
	slices.SortFunc(ls, func(a, b map[string]string) int {
		return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
	})
}
