package assets

import (
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// ExporterJob is the scrape job of dcgm-exporter's ServiceMonitor: the
// Prometheus Operator names the job after the Service.
const ExporterJob = "loom-dcgm-exporter"

// exporter selects the series of Loom's dcgm-exporter, so that a second
// dcgm-exporter in the cluster (GPU Operator's, say) is not counted twice.
const exporter = `job="` + ExporterJob + `"`

// notMIG leaves out the series of MIG devices (dcgm-exporter's GPU_I_ID)
// where they say nothing: DCGM measures no DCGM_FI_DEV_GPU_UTIL per MIG
// device, and dcgm-exporter reports it as 0 however busy the device is.
const notMIG = `GPU_I_ID=""`

// gpuUtil are the utilisation series (%) of Loom's dcgm-exporter that
// measure something: whole GPUs.
const gpuUtil = `DCGM_FI_DEV_GPU_UTIL{` + exporter + `, ` + notMIG

// fbMiB converts dcgm-exporter's framebuffer figures, which are MiB, to
// bytes.
const fbMiB = "1048576"

// The recording rules. Names follow level:metric:operation; the metric part
// keeps "dcgm" so that they sort next to the series they come from.
const (
	// RecordNodeGPUUtilization is the mean GPU utilisation (%) per node.
	RecordNodeGPUUtilization = "node:dcgm_gpu_utilization:avg"
	// RecordNamespaceGPUUtilization is the mean utilisation (%) of the GPUs
	// allocated to pods, per namespace.
	RecordNamespaceGPUUtilization = "namespace:dcgm_gpu_utilization:avg"
	// RecordTrainingJobGPUUtilization is the mean utilisation (%) of a
	// TrainingJob's GPUs, with labels namespace and trainingjob.
	RecordTrainingJobGPUUtilization = "namespace_trainingjob:dcgm_gpu_utilization:avg"
	// RecordNamespaceGPUsAllocated counts the GPUs (or MIG devices) allocated
	// to pods, per namespace.
	RecordNamespaceGPUsAllocated = "namespace:dcgm_gpus_allocated:count"
	// RecordNodeGPUs counts the physical GPUs dcgm-exporter reports per node
	// (MIG devices of one GPU count once).
	RecordNodeGPUs = "node:dcgm_gpus:count"
	// RecordNodeFBUsedBytes is the framebuffer memory in use per node.
	RecordNodeFBUsedBytes = "node:dcgm_fb_used_bytes:sum"
	// RecordNodeFBTotalBytes is the framebuffer memory per node, used plus
	// free (the driver's reserved part is in neither).
	RecordNodeFBTotalBytes = "node:dcgm_fb_total_bytes:sum"
	// RecordNamespaceFBUsedBytes is the framebuffer memory used by the pods
	// of each namespace.
	RecordNamespaceFBUsedBytes = "namespace:dcgm_fb_used_bytes:sum"
)

// LabelTrainingJob is the label RecordTrainingJobGPUUtilization carries the
// TrainingJob's name in.
const LabelTrainingJob = "trainingjob"

// trainingJobPod matches the pods of a TrainingJob, <job>-master-<i> and
// <job>-worker-<i>; the first group is the job. DCGM series name a pod but
// carry none of its labels, so the name is all there is to go by: a pod of
// some other workload named like that would be counted as a job's.
const trainingJobPod = `(.+)-(?:master|worker)-[0-9]+`

// GPURules is Loom's PrometheusRule: recording rules for utilisation and
// memory, then the alerts, grouped by what an SRE does about them. Every
// alert has labels.severity (critical, warning or info) and the annotations
// summary, description and runbook.
func GPURules() monitoringv1.PrometheusRuleSpec {
	return monitoringv1.PrometheusRuleSpec{Groups: []monitoringv1.RuleGroup{
		{Name: "loom-gpu.rules", Rules: recordingRules()},
		{Name: "loom-gpu.health", Rules: rules(healthAlerts())},
		{Name: "loom-gpu.exporter", Rules: rules(exporterAlerts())},
		{Name: "loom-gpu.inventory", Rules: rules(inventoryAlerts())},
		{Name: "loom-gpu.utilization", Rules: rules(utilizationAlerts())},
	}}
}

func recordingRules() []monitoringv1.Rule {
	record := func(name, expr string) monitoringv1.Rule {
		return monitoringv1.Rule{Record: name, Expr: intstr.FromString(expr)}
	}
	return []monitoringv1.Rule{
		record(RecordNodeGPUUtilization,
			`avg by (node) (`+gpuUtil+`})`),
		record(RecordNamespaceGPUUtilization,
			`avg by (namespace) (`+gpuUtil+`, namespace!=""})`),
		record(RecordTrainingJobGPUUtilization,
			`avg by (namespace, `+LabelTrainingJob+`) (
  label_replace(
    `+gpuUtil+`, namespace!="", pod=~"`+trainingJobPod+`"},
    "`+LabelTrainingJob+`", "$1", "pod", "`+trainingJobPod+`"
  )
)`),
		// A MIG device is its own allocation: count GPU instances, not GPUs.
		record(RecordNamespaceGPUsAllocated,
			`count by (namespace) (
  count by (namespace, node, UUID, GPU_I_ID) (DCGM_FI_DEV_FB_USED{`+exporter+`, namespace!=""})
)`),
		// Distinct gpu indexes per node: MIG repeats a GPU once per instance.
		// FB_USED exists per MIG instance and GPU_TEMP per GPU, so a GPU
		// counts whether or not MIG splits it.
		record(RecordNodeGPUs,
			`count by (node) (
  count by (node, gpu) (DCGM_FI_DEV_FB_USED{`+exporter+`} or DCGM_FI_DEV_GPU_TEMP{`+exporter+`})
)`),
		record(RecordNodeFBUsedBytes,
			`sum by (node) (DCGM_FI_DEV_FB_USED{`+exporter+`}) * `+fbMiB),
		record(RecordNodeFBTotalBytes,
			`sum by (node) (DCGM_FI_DEV_FB_USED{`+exporter+`} + DCGM_FI_DEV_FB_FREE{`+exporter+`}) * `+fbMiB),
		record(RecordNamespaceFBUsedBytes,
			`sum by (namespace) (DCGM_FI_DEV_FB_USED{`+exporter+`, namespace!=""}) * `+fbMiB),
	}
}

// alert is an alerting rule with the annotations every Loom alert has.
type alert struct {
	name     string
	severity string
	expr     string
	// holdFor is the rule's for: how long expr must hold before it fires.
	holdFor monitoringv1.Duration
	// summary, description and runbook are Prometheus templates
	// ($labels, $value).
	summary, description, runbook string
	// cordonedSeverity, when set, is the severity of the alert on a
	// cordoned node (see cordoned): the alert is then two rules of its
	// name, severity on schedulable nodes and cordonedSeverity, labelled
	// cordoned="true", on cordoned ones.
	cordonedSeverity string
}

// LabelCordoned marks the alerts of a cordoned node, whose severity is one
// step lower (critical to warning, warning to info).
const LabelCordoned = "cordoned"

// Severities of Loom's alerts: critical pages (the GPU is broken or about
// to break the workloads on it), warning opens a ticket, info is a report.
const (
	SeverityCritical = "critical"
	SeverityWarning  = "warning"
	SeverityInfo     = "info"
)

// rules are the alerting rules of alerts; an alert with a
// cordonedSeverity is two: its own expression on schedulable nodes, and on
// cordoned nodes at the lower severity. Prometheus takes several rules of
// one alert name; the one alert moves from the first to the second when
// its node is cordoned (its for: starting again), and back.
func rules(alerts []alert) []monitoringv1.Rule {
	out := make([]monitoringv1.Rule, 0, len(alerts))
	for _, a := range alerts {
		if a.cordonedSeverity == "" {
			out = append(out, rule(a))
			continue
		}
		schedulable, onCordoned := a, a
		schedulable.expr = "(\n" + a.expr + "\n)\nunless on (node) (" + cordoned + ")"
		onCordoned.expr = "(\n" + a.expr + "\n)\nand on (node) (" + cordoned + ")"
		onCordoned.severity = a.cordonedSeverity
		r := rule(onCordoned)
		r.Labels[LabelCordoned] = "true"
		out = append(out, rule(schedulable), r)
	}
	return out
}

func rule(a alert) monitoringv1.Rule {
	r := monitoringv1.Rule{
		Alert:  a.name,
		Expr:   intstr.FromString(a.expr),
		Labels: map[string]string{"severity": a.severity},
		Annotations: map[string]string{
			"summary":     a.summary,
			"description": a.description,
			"runbook":     a.runbook,
		},
	}
	if a.holdFor != "" {
		r.For = ptr.To(a.holdFor)
	}
	return r
}
