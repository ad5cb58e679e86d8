package monitoring

import (
	"maps"
	"slices"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/controllers/monitoring/assets"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
)

// Names and annotations of the objects the monitoring reconcilers write.
const (
	// AnnotationScrape: "false" on a TrainingJob or RayCluster opts it out
	// of its PodMonitor.
	AnnotationScrape = "monitoring.loom.dev/scrape"

	// ExporterName names dcgm-exporter's Service and ServiceMonitor, like
	// its DaemonSet; it is also the scrape job.
	ExporterName = assets.ExporterJob
	// ExporterPortName is GPU Operator's port name (the standalone chart's
	// "metrics" is a known cause of broken scrapes).
	ExporterPortName = "gpu-metrics"
	ExporterPort     = 9400
	// CountersConfigMap holds Loom's dcgm-exporter counters (with the ECC
	// fields the alerts need) unless the policy names its own.
	CountersConfigMap = gpuv1alpha1.DefaultDCGMCountersConfigMap
	// RuleName is the PrometheusRule with Loom's GPU alerts and recordings.
	RuleName = "loom-gpu"
	// DashboardsConfigMap carries the Grafana dashboards (sidecar label
	// grafana_dashboard=1).
	DashboardsConfigMap = "loom-grafana-dashboards"
	// MetricsPortName is the container port a TrainingJob declares to be
	// scraped (Ray's is "metrics" too, on 8080; the node agent's too, on
	// the chart's nodeAgent.metricsPort).
	MetricsPortName = "metrics"
	// NodeAgentPodMonitorName names the node agent's PodMonitor, in the
	// namespace Loom runs in.
	NodeAgentPodMonitorName = "loom-node-agent"
	// ManagerServiceMonitorName names the manager's own ServiceMonitor, in
	// the namespace Loom runs in, and ManagerMetricsPortName the port of
	// the manager's metrics Service it scrapes (the chart's).
	ManagerServiceMonitorName = "loom-manager-metrics"
	ManagerMetricsPortName    = "https-metrics"
)

// Components of the children that are no operand's (dcgm-exporter's
// children carry its operand name).
const (
	componentAlerts      = "alerts"
	componentDashboards  = "dashboards"
	componentTrainingJob = "trainingjob"
	componentRayCluster  = "raycluster"
	// componentNodeAgent is the node agent's component label (the chart's
	// app.kubernetes.io/component on its pods).
	componentNodeAgent = "node-agent"
	// componentManager is the manager's component label (the chart's
	// app.kubernetes.io/component on its metrics Service).
	componentManager = "manager"
)

// ownedLabels are the labels of a monitoring child: Loom's, and the
// component it belongs to (the watches select children by them).
func ownedLabels(component string) map[string]string {
	return map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: component}
}

// ExporterService is dcgm-exporter's Service: headless, since only
// Prometheus reads it, through its endpoints.
func ExporterService(namespace string) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: ExporterName, Namespace: namespace, Labels: ownedLabels(gpuv1alpha1.OperandDCGMExporter)},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  gpuv1alpha1.ExporterSelector(),
			Ports: []corev1.ServicePort{{Name: ExporterPortName, Port: ExporterPort, TargetPort: intstr.FromString(ExporterPortName),
				Protocol: corev1.ProtocolTCP}},
		},
	}
}

// CountersConfig is Loom's dcgm-exporter counters ConfigMap.
func CountersConfig(namespace string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: CountersConfigMap, Namespace: namespace, Labels: ownedLabels(gpuv1alpha1.OperandDCGMExporter)},
		Data:       map[string]string{assets.DCGMMetricsKey: assets.DCGMMetricsCSV},
	}
}

// Dashboards is the Grafana dashboards ConfigMap.
func Dashboards(namespace string) *corev1.ConfigMap {
	l := ownedLabels(componentDashboards)
	l["grafana_dashboard"] = "1"
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: DashboardsConfigMap, Namespace: namespace, Labels: l},
		Data:       assets.Dashboards(),
	}
}

// ExporterServiceMonitor scrapes dcgm-exporter. honorLabels keeps the
// namespace/pod/container of the workload that uses a GPU (dcgm-exporter's
// pod mapping); the exporter's own target namespace/pod/container are
// dropped so that a free GPU carries none, and node is the exporter pod's
// node.
func ExporterServiceMonitor(namespace string, selection map[string]string) *monitoringv1.ServiceMonitor {
	labels := ownedLabels(gpuv1alpha1.OperandDCGMExporter)
	maps.Copy(labels, selection)
	return &monitoringv1.ServiceMonitor{
		TypeMeta:   metav1.TypeMeta{APIVersion: monitoringv1.SchemeGroupVersion.String(), Kind: monitoringv1.ServiceMonitorsKind},
		ObjectMeta: metav1.ObjectMeta{Name: ExporterName, Namespace: namespace, Labels: labels},
		Spec: monitoringv1.ServiceMonitorSpec{
			Selector:          metav1.LabelSelector{MatchLabels: ownedLabels(gpuv1alpha1.OperandDCGMExporter)},
			NamespaceSelector: monitoringv1.NamespaceSelector{MatchNames: []string{namespace}},
			Endpoints: []monitoringv1.Endpoint{{
				Port:        ExporterPortName,
				Path:        "/metrics",
				HonorLabels: true,
				RelabelConfigs: []monitoringv1.RelabelConfig{
					{SourceLabels: []monitoringv1.LabelName{"__meta_kubernetes_pod_node_name"}, TargetLabel: "node", Action: "replace"},
					{Action: "labeldrop", Regex: "namespace|pod|container"},
				},
			}},
		},
	}
}

// ManagerScrape says how the manager's metrics are served: the Service
// (empty: no ServiceMonitor for them), whether over HTTPS with Kubernetes
// authentication, and how often to scrape (empty: the Prometheus's own).
type ManagerScrape struct {
	Service, Interval string
	Secure            bool
}

// ManagerServiceMonitor scrapes the manager's own metrics (the inventory
// metrics the GPU alerts are built on, and controller-runtime's): the
// Service named by m, among the Services of the manager's component in
// namespace. Served securely, the scrape sends Prometheus's service
// account token, which must be allowed to get the non-resource URL
// /metrics, and does not verify the manager's certificate (self-signed
// unless --metrics-cert-dir names one).
func ManagerServiceMonitor(namespace string, m ManagerScrape, selection map[string]string) *monitoringv1.ServiceMonitor {
	labels := ownedLabels(componentManager)
	maps.Copy(labels, selection)
	ep := monitoringv1.Endpoint{
		Port:     ManagerMetricsPortName,
		Path:     "/metrics",
		Scheme:   ptr.To(monitoringv1.Scheme("http")),
		Interval: monitoringv1.Duration(m.Interval),
		RelabelConfigs: []monitoringv1.RelabelConfig{{SourceLabels: []monitoringv1.LabelName{"__meta_kubernetes_service_name"},
			Regex: m.Service, Action: "keep"}},
	}
	if m.Secure {
		ep.Scheme = ptr.To(monitoringv1.Scheme("https"))
		// Deprecated for authorization, which reads a Secret: only the
		// file is Prometheus's own, rotated token (see fileAccessDenied).
		ep.BearerTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token" //nolint:staticcheck // the token of Prometheus's own service account
		ep.TLSConfig = &monitoringv1.TLSConfig{SafeTLSConfig: monitoringv1.SafeTLSConfig{InsecureSkipVerify: ptr.To(true)}}
	}
	return &monitoringv1.ServiceMonitor{
		TypeMeta:   metav1.TypeMeta{APIVersion: monitoringv1.SchemeGroupVersion.String(), Kind: monitoringv1.ServiceMonitorsKind},
		ObjectMeta: metav1.ObjectMeta{Name: ManagerServiceMonitorName, Namespace: namespace, Labels: labels},
		Spec: monitoringv1.ServiceMonitorSpec{
			Selector:          metav1.LabelSelector{MatchLabels: map[string]string{gpuv1alpha1.LabelComponent: componentManager}},
			NamespaceSelector: monitoringv1.NamespaceSelector{MatchNames: []string{namespace}},
			Endpoints:         []monitoringv1.Endpoint{ep},
		},
	}
}

// GPURule is the PrometheusRule with Loom's GPU alerts and recording rules.
func GPURule(namespace string, selection map[string]string) *monitoringv1.PrometheusRule {
	labels := ownedLabels(componentAlerts)
	maps.Copy(labels, selection)
	return &monitoringv1.PrometheusRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: monitoringv1.SchemeGroupVersion.String(), Kind: monitoringv1.PrometheusRuleKind},
		ObjectMeta: metav1.ObjectMeta{Name: RuleName, Namespace: namespace, Labels: labels},
		Spec:       assets.GPURules(),
	}
}

// TrainingJobPodMonitorName and RayClusterPodMonitorName are the workload
// PodMonitors' names; the prefix keeps them apart from a user's own.
func TrainingJobPodMonitorName(job string) string    { return "loom-trainingjob-" + job }
func RayClusterPodMonitorName(cluster string) string { return "loom-raycluster-" + cluster }

// OptedOut reports the opt-out annotation.
func OptedOut(o metav1.Object) bool { return o.GetAnnotations()[AnnotationScrape] == "false" }

// TrainingJobPodMonitor scrapes the job's pods on their "metrics" port; nil
// when no container of the job declares one.
func TrainingJobPodMonitor(job *trainingv1alpha1.TrainingJob, selection map[string]string) *monitoringv1.PodMonitor {
	templates := []*corev1.PodTemplateSpec{&job.Spec.ReplicaSpecs.Master.Template}
	if r := job.Spec.ReplicaSpecs.Worker; r != nil {
		templates = append(templates, &r.Template)
	}
	if !slices.ContainsFunc(templates, declaresMetricsPort) {
		return nil
	}
	return podMonitor(TrainingJobPodMonitorName(job.Name), job.Namespace, componentTrainingJob, selection,
		map[string]string{trainingv1alpha1.LabelJobName: job.Name},
		[]string{trainingv1alpha1.LabelJobName, trainingv1alpha1.LabelReplicaType, trainingv1alpha1.LabelReplicaIndex})
}

// RayClusterPodMonitor scrapes Ray's metrics port (8080, named "metrics"
// by KubeRay's pod builder) on the head and every worker.
func RayClusterPodMonitor(rc *rayv1.RayCluster, selection map[string]string) *monitoringv1.PodMonitor {
	return podMonitor(RayClusterPodMonitorName(rc.Name), rc.Namespace, componentRayCluster, selection,
		map[string]string{"ray.io/cluster": rc.Name},
		[]string{"ray.io/cluster", "ray.io/node-type", "ray.io/group"})
}

// NodeAgentPodMonitor scrapes the node agent's own metrics on every GPU
// node (its pods in namespace, by the chart's component label, port
// "metrics"), each series labelled with the agent pod's node.
func NodeAgentPodMonitor(namespace string, selection map[string]string) *monitoringv1.PodMonitor {
	pm := podMonitor(NodeAgentPodMonitorName, namespace, componentNodeAgent, selection,
		map[string]string{gpuv1alpha1.LabelComponent: componentNodeAgent}, nil)
	pm.Spec.PodMetricsEndpoints[0].RelabelConfigs = []monitoringv1.RelabelConfig{
		{SourceLabels: []monitoringv1.LabelName{"__meta_kubernetes_pod_node_name"}, TargetLabel: "node", Action: "replace"}}
	return pm
}

// declaresMetricsPort: a container of the template, or a native sidecar
// (an init container that restarts always, running beside them), has a
// port named metrics. Prometheus's pod discovery lists both.
func declaresMetricsPort(t *corev1.PodTemplateSpec) bool {
	has := func(c *corev1.Container) bool {
		for _, p := range c.Ports {
			if p.Name == MetricsPortName {
				return true
			}
		}
		return false
	}
	for i := range t.Spec.Containers {
		if has(&t.Spec.Containers[i]) {
			return true
		}
	}
	for i := range t.Spec.InitContainers {
		c := &t.Spec.InitContainers[i]
		if inventory.Sidecar(c) && has(c) {
			return true
		}
	}
	return false
}

func podMonitor(name, namespace, component string, selection, podSelector map[string]string, targetLabels []string) *monitoringv1.PodMonitor {
	labels := ownedLabels(component)
	maps.Copy(labels, selection)
	return &monitoringv1.PodMonitor{
		TypeMeta:   metav1.TypeMeta{APIVersion: monitoringv1.SchemeGroupVersion.String(), Kind: monitoringv1.PodMonitorsKind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: monitoringv1.PodMonitorSpec{
			Selector:            metav1.LabelSelector{MatchLabels: podSelector},
			NamespaceSelector:   monitoringv1.NamespaceSelector{MatchNames: []string{namespace}},
			PodTargetLabels:     targetLabels,
			PodMetricsEndpoints: []monitoringv1.PodMetricsEndpoint{{Port: ptr.To(MetricsPortName), Path: "/metrics"}},
		},
	}
}
