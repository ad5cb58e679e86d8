package assets

import (
	"k8s.io/utils/ptr"
)

// rayClusterPod matches the pods of the Ray cluster $raycluster, named as
// KubeRay names them: <cluster>-head-<suffix> and
// <cluster>-<group>-worker-<suffix>. (KubeRay cuts the prefix of a name
// longer than 50 characters; such a cluster's pods do not match.)
const rayClusterPod = `$raycluster-(head|.+-worker)-[a-z0-9]+`

// rayClusterLabel is the target label Ray's PodMonitor copies from the pod
// label ray.io/cluster (the Prometheus Operator turns "." and "/" into "_").
const rayClusterLabel = "ray_io_cluster"

func workloadDashboard() dashboard {
	inNamespace := `namespace="$namespace"`
	job := []string{exporter, inNamespace, `pod=~"$trainingjob-(master|worker)-[0-9]+"`}
	rayPods := []string{exporter, inNamespace, `pod=~"` + rayClusterPod + `"`}
	ray := func(metric string) string {
		return selector(metric, inNamespace, rayClusterLabel+`="$raycluster"`)
	}
	perPodGPU := "{{pod}} gpu {{gpu}}"
	share := fieldDefaults{Unit: unitPercentUnit, Min: ptr.To(0.0), Max: ptr.To(1.0)}
	fbShare := func(m []string) string {
		return selector("DCGM_FI_DEV_FB_USED", m...) + " / (" + selector("DCGM_FI_DEV_FB_USED", m...) + " + " +
			selector("DCGM_FI_DEV_FB_FREE", m...) + ")"
	}

	var l layout
	l.row("TrainingJob $trainingjob")
	l.timeseries("GPU utilisation, job mean", "", percentRange(),
		series{expr: selector(RecordTrainingJobGPUUtilization, inNamespace, LabelTrainingJob+`="$trainingjob"`), legend: "$trainingjob"})
	l.timeseries("GPU utilisation by pod", "", percentRange(),
		series{expr: selector("DCGM_FI_DEV_GPU_UTIL", append(job, notMIG)...), legend: perPodGPU})
	l.timeseries("Framebuffer used", "", unit(unitBytes),
		series{expr: selector("DCGM_FI_DEV_FB_USED", job...) + " * " + fbMiB, legend: perPodGPU})
	l.timeseries("Framebuffer used, share", "", share,
		series{expr: fbShare(job), legend: perPodGPU})
	l.timeseries("Power", "", unit(unitWatt),
		series{expr: selector("DCGM_FI_DEV_POWER_USAGE", job...), legend: perPodGPU})
	l.timeseries("Xid errors", "The last Xid of each of the job's GPUs, when there is one.", unit(unitShort),
		series{expr: selector("DCGM_FI_DEV_XID_ERRORS", job...) + " != 0", legend: perPodGPU + " Xid {{err_code}} {{err_msg}}"})

	l.row("Ray cluster $raycluster")
	l.timeseries("GPU utilisation by pod (dcgm-exporter)", "", percentRange(),
		series{expr: selector("DCGM_FI_DEV_GPU_UTIL", append(rayPods, notMIG)...), legend: perPodGPU})
	l.timeseries("Framebuffer used (dcgm-exporter)", "", unit(unitBytes),
		series{expr: selector("DCGM_FI_DEV_FB_USED", rayPods...) + " * " + fbMiB, legend: perPodGPU})
	// Ray reads utilisation through NVML, which has none for a MIG
	// device: Ray reports -1 for each of its MIG devices (GpuIndex
	// gpu×1000+instance), Ray before its MIG support 0 for the GPU split,
	// however busy. Negative values and the pods dcgm-exporter maps a MIG
	// device to are left out, as the dcgm-exporter panels leave MIG out.
	l.timeseries("GPU utilisation (Ray)", "As Ray's node agents measure it; not for MIG devices, which NVML measures no utilisation of.", percentRange(),
		series{expr: ray("ray_node_gpus_utilization") + " >= 0 unless on (namespace, pod) " +
			selector("DCGM_FI_DEV_FB_USED", exporter, inNamespace, `GPU_I_ID!=""`), legend: "{{pod}} gpu {{GpuIndex}}"})
	// Ray's documentation says bytes, but Ray reports MiB and its own
	// dashboards multiply by 1024².
	l.timeseries("GPU memory used (Ray)", "", unit(unitBytes),
		series{expr: ray("ray_node_gram_used") + " * " + fbMiB, legend: "{{pod}} gpu {{GpuIndex}}"})
	l.timeseries("CPU utilisation", "", percentRange(),
		series{expr: ray("ray_node_cpu_utilization"), legend: "{{pod}}"})
	l.timeseries("Memory used", "", unit(unitBytes),
		series{expr: ray("ray_node_mem_used"), legend: "{{pod}}"})
	l.timeseries("Tasks by state", "", unit(unitShort),
		series{expr: "sum by (State) (" + ray("ray_tasks") + ")", legend: "{{State}}"})
	l.timeseries("Actors by state", "", unit(unitShort),
		series{expr: "sum by (State) (" + ray("ray_actors") + ")", legend: "{{State}}"})

	vars := []variable{
		datasourceVariable(),
		labelValues("namespace", "Namespace", selector("DCGM_FI_DEV_FB_USED", exporter, `namespace!=""`), "namespace", false, ""),
		labelValues("trainingjob", "TrainingJob", selector(RecordTrainingJobGPUUtilization, inNamespace), LabelTrainingJob, false, ""),
		labelValues("raycluster", "Ray cluster", selector("ray_node_cpu_utilization", inNamespace), rayClusterLabel, false, ""),
	}
	return newDashboard("loom-workload", "Loom / Workload GPUs",
		"The GPUs of one TrainingJob or Ray cluster: utilisation and memory from dcgm-exporter, and Ray's own metrics.",
		vars, l.panels)
}
