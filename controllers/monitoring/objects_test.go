package monitoring

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// A metrics port on a native sidecar (an init container that restarts
// always) is scraped like a container's; a plain init container's is not.
func TestSidecarMetricsPort(t *testing.T) {
	port := []corev1.ContainerPort{{Name: MetricsPortName, ContainerPort: 9090}}
	for _, tc := range []struct {
		name    string
		restart *corev1.ContainerRestartPolicy
		want    bool
	}{
		{"native sidecar", ptr.To(corev1.ContainerRestartPolicyAlways), true},
		{"init container", nil, false},
	} {
		job := trainingJob("ml", "bert", false)
		init := []corev1.Container{{Name: "exporter", Image: "exporter:1", RestartPolicy: tc.restart, Ports: port}}
		job.Spec.ReplicaSpecs.Master.Template.Spec.InitContainers = init
		job.Spec.ReplicaSpecs.Worker.Template.Spec.InitContainers = init
		if got := TrainingJobPodMonitor(job, nil) != nil; got != tc.want {
			t.Errorf("%s with port %q: PodMonitor %v, want %v", tc.name, MetricsPortName, got, tc.want)
		}
	}
}
