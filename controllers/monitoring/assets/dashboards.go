package assets

import (
	"fmt"
	"strings"

	"k8s.io/utils/ptr"
)

// Dashboard file names, the keys of Dashboards.
const (
	FleetDashboard    = "loom-gpu-fleet.json"
	WorkloadDashboard = "loom-workload.json"
)

// Dashboards are Loom's Grafana dashboards by file name: the GPU fleet, and
// the GPUs of one workload (a TrainingJob or a Ray cluster).
func Dashboards() map[string]string {
	return map[string]string{
		FleetDashboard:    render(fleetDashboard()),
		WorkloadDashboard: render(workloadDashboard()),
	}
}

// selector is metric{matchers...}.
func selector(metric string, matchers ...string) string {
	return metric + "{" + strings.Join(matchers, ", ") + "}"
}

// Matchers of the dashboards' variables.
const (
	onNode      = `node=~"$node"`
	onNamespace = `namespace=~"$namespace"`
)

func fleetDashboard() dashboard {
	dcgm := func(metric string, matchers ...string) string {
		return selector(metric, append([]string{exporter, onNode}, matchers...)...)
	}
	allocated := `namespace!=""`
	idle := fmt.Sprintf(`max_over_time(%s[1h]) < %d`, dcgm("DCGM_FI_DEV_GPU_UTIL", notMIG, allocated), IdleUtilizationPercent)
	perGPU := "{{node}} gpu {{gpu}}"

	var l layout
	l.row("Overview")
	l.stat("GPUs in the inventory", "GPUs Loom's node agents found through NVML.", unit(unitShort),
		series{expr: `sum(` + selector("loom_gpunode_gpus", onNode) + `)`})
	l.stat("GPUs reporting", "GPUs dcgm-exporter reports (fewer than the inventory: LoomGPUMissing).", unit(unitShort),
		series{expr: `sum(` + selector(RecordNodeGPUs, onNode) + `)`})
	l.stat("Unhealthy GPUs", "GPUs the node agents mark Unhealthy.", redFrom(unitShort, 1),
		series{expr: `sum(` + selector("loom_gpunode_unhealthy_gpus", onNode) + `)`})
	l.stat("Allocated GPUs", "GPUs and MIG devices allocated to pods.", unit(unitShort),
		series{expr: `count(count by (node, UUID, GPU_I_ID) (` + dcgm("DCGM_FI_DEV_FB_USED", allocated) + `)) or vector(0)`})
	l.stat("Idle allocated GPUs", fmt.Sprintf("Allocated GPUs whose utilisation stayed below %d%% for the last hour (MIG devices have no utilisation figure).", IdleUtilizationPercent),
		redFrom(unitShort, 1), series{expr: `count(` + idle + `) or vector(0)`})
	l.stat("Mean GPU utilisation", "", percentRange(),
		series{expr: `avg(` + dcgm("DCGM_FI_DEV_GPU_UTIL", notMIG) + `)`})

	l.row("Utilisation")
	l.timeseries("GPU utilisation by node", "", percentRange(),
		series{expr: selector(RecordNodeGPUUtilization, onNode), legend: "{{node}}"})
	l.timeseries("GPU utilisation by GPU", "", percentRange(),
		series{expr: dcgm("DCGM_FI_DEV_GPU_UTIL", notMIG), legend: perGPU})
	l.timeseries("GPU utilisation by namespace", "Mean utilisation of the GPUs allocated to the namespace's pods.", percentRange(),
		series{expr: selector(RecordNamespaceGPUUtilization, onNamespace), legend: "{{namespace}}"})
	l.timeseries("Allocated and idle GPUs by namespace",
		fmt.Sprintf("Idle: utilisation below %d%% for the last hour.", IdleUtilizationPercent), unit(unitShort),
		series{expr: selector(RecordNamespaceGPUsAllocated, onNamespace), legend: "{{namespace}} allocated"},
		series{expr: fmt.Sprintf(`count by (namespace) (max_over_time(%s[1h]) < %d)`,
			selector("DCGM_FI_DEV_GPU_UTIL", exporter, notMIG, onNamespace), IdleUtilizationPercent), legend: "{{namespace}} idle"})

	l.row("Memory")
	l.timeseries("Framebuffer by node", "", unit(unitBytes),
		series{expr: selector(RecordNodeFBUsedBytes, onNode), legend: "{{node}} used"},
		series{expr: selector(RecordNodeFBTotalBytes, onNode), legend: "{{node}} total"})
	l.timeseries("Framebuffer used by GPU", "", unit(unitBytes),
		series{expr: dcgm("DCGM_FI_DEV_FB_USED") + " * " + fbMiB, legend: perGPU + " {{GPU_I_PROFILE}}"})
	l.timeseries("Framebuffer used by namespace", "", unit(unitBytes),
		series{expr: selector(RecordNamespaceFBUsedBytes, onNamespace), legend: "{{namespace}}"})
	l.timeseries("Framebuffer used, share", "", fieldDefaults{Unit: unitPercentUnit, Min: ptr.To(0.0), Max: ptr.To(1.0)},
		series{expr: dcgm("DCGM_FI_DEV_FB_USED") + " / (" + dcgm("DCGM_FI_DEV_FB_USED") + " + " + dcgm("DCGM_FI_DEV_FB_FREE") + ")",
			legend: perGPU + " {{GPU_I_PROFILE}}"})

	l.row("Health")
	l.timeseries("Temperature", fmt.Sprintf("LoomGPUTemperatureHigh fires above %d °C.", GPUTempHighCelsius),
		redFrom(unitCelsius, GPUTempHighCelsius),
		series{expr: `max by (node, gpu) (` + dcgm("DCGM_FI_DEV_GPU_TEMP") + `)`, legend: perGPU})
	l.timeseries("Power", "", unit(unitWatt),
		series{expr: `max by (node, gpu) (` + dcgm("DCGM_FI_DEV_POWER_USAGE") + `)`, legend: perGPU})
	l.timeseries("Xid errors", "The last Xid of each GPU (0 is none); it stays until dcgm-exporter restarts.", unit(unitShort),
		series{expr: `max by (node, gpu, err_code, err_msg) (` + dcgm("DCGM_FI_DEV_XID_ERRORS") + `) != 0`,
			legend: perGPU + " Xid {{err_code}} {{err_msg}}"})
	l.timeseries("ECC errors", "New ECC errors per interval.", unit(unitShort),
		series{expr: `max by (node, gpu) (increase(` + dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") + `[$__rate_interval]))`,
			legend: perGPU + " uncorrectable"},
		series{expr: `max by (node, gpu) (increase(` + dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL") + `[$__rate_interval]))`,
			legend: perGPU + " correctable"})
	l.timeseries("Row remapping", "Remap pending: a GPU reset applies it. Remap failure: RMA.", unit(unitShort),
		series{expr: `max by (node, gpu) (` + dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING") + `) > 0`, legend: perGPU + " pending"},
		series{expr: `max by (node, gpu) (` + dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE") + `) > 0`, legend: perGPU + " failed"},
		series{expr: `max by (node, gpu) (` + dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") + `) > 0`,
			legend: perGPU + " rows remapped (uncorrectable)"},
		series{expr: `max by (node, gpu) (` + dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") + `) > 0`,
			legend: perGPU + " rows remapped (correctable)"})
	l.timeseries("PCIe replays", "PCIe retries per interval: a rising count points at a bad riser or slot.", unit(unitShort),
		series{expr: `max by (node, gpu) (increase(` + dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER") + `[$__rate_interval])) > 0`,
			legend: perGPU})

	l.row("Inventory and operands")
	l.timeseries("Unhealthy GPUs by node", "From Loom's node agents.", unit(unitShort),
		series{expr: `max by (node) (` + selector("loom_gpunode_unhealthy_gpus", onNode) + `)`, legend: "{{node}}"})
	l.timeseries("Node agents reporting", "1: the node agent's last collection succeeded.", fieldDefaults{Unit: unitShort, Min: ptr.To(0.0), Max: ptr.To(1.0)},
		series{expr: `max by (node) (` + selector("loom_gpunode_ready", onNode) + `)`, legend: "{{node}}"})
	l.timeseries("Operands ready", "Nodes each operand runs ready on, of the nodes it should run on.", unit(unitShort),
		series{expr: `max by (component) (loom_clusterpolicy_component_ready_nodes)`, legend: "{{component}} ready"},
		series{expr: `max by (component) (loom_clusterpolicy_component_desired_nodes)`, legend: "{{component}} desired"})
	l.timeseries("Driver upgrades", "GPU nodes by driver upgrade progress.", unit(unitShort),
		series{expr: `max by (state) (loom_driver_upgrade_nodes)`, legend: "{{state}}"},
		series{expr: `max(loom_clusterpolicy_ready)`, legend: "ClusterPolicy ready"})
	l.timeseries("TrainingJobs by state", "", unit(unitShort),
		series{expr: `max by (state) (loom_trainingjobs) > 0`, legend: "{{state}}"})

	vars := []variable{
		datasourceVariable(),
		labelValues("node", "Node", "loom_gpunode_gpus", "node", true, ".*"),
		// ".+" for All: a free GPU has no namespace and is in no namespace's figures.
		labelValues("namespace", "Namespace", selector("DCGM_FI_DEV_FB_USED", exporter, `namespace!=""`), "namespace", true, ".+"),
	}
	return newDashboard("loom-gpu-fleet", "Loom / GPU fleet",
		"Utilisation, memory and health of every GPU Loom manages, from dcgm-exporter and Loom's inventory.", vars, l.panels)
}
