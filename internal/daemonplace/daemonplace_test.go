package daemonplace

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPlaces(t *testing.T) {
	taint := func(key string, effect corev1.TaintEffect) corev1.Taint {
		return corev1.Taint{Key: key, Value: "x", Effect: effect}
	}
	node := func(labels map[string]string, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	gpu := map[string]string{"nvidia.com/gpu.present": "true"}
	selecting := corev1.PodSpec{NodeSelector: gpu}
	tolerant := corev1.PodSpec{NodeSelector: gpu, Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}}
	hostNet := corev1.PodSpec{HostNetwork: true}
	for _, tt := range []struct {
		name string
		spec corev1.PodSpec
		node *corev1.Node
		want bool
	}{
		{"selector matches, no taint", selecting, node(gpu), true},
		{"selector does not match", selecting, node(nil), false},
		{"a taint it does not tolerate", selecting, node(gpu, taint("dedicated", corev1.TaintEffectNoSchedule)), false},
		{"NoExecute counts too", selecting, node(gpu, taint("dedicated", corev1.TaintEffectNoExecute)), false},
		{"PreferNoSchedule does not", selecting, node(gpu, taint("dedicated", corev1.TaintEffectPreferNoSchedule)), true},
		{"tolerated by the template", tolerant, node(gpu, taint("dedicated", corev1.TaintEffectNoSchedule)), true},
		{"cordoned: the DaemonSet controller tolerates it", selecting, node(gpu, taint(corev1.TaintNodeUnschedulable, corev1.TaintEffectNoSchedule)), true},
		{"not ready: tolerated", selecting, node(gpu, taint(corev1.TaintNodeNotReady, corev1.TaintEffectNoExecute)), true},
		{"network unavailable: only host network pods", selecting, node(gpu, taint(corev1.TaintNodeNetworkUnavailable, corev1.TaintEffectNoSchedule)), false},
		{"network unavailable, host network", hostNet, node(gpu, taint(corev1.TaintNodeNetworkUnavailable, corev1.TaintEffectNoSchedule)), true},
	} {
		if got := Places(&tt.spec, tt.node); got != tt.want {
			t.Errorf("%s: Places = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestUntoleratedSkips(t *testing.T) {
	n := &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{
		{Key: "node.kubernetes.io/out-of-service", Effect: corev1.TaintEffectNoExecute},
		{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule},
	}}}
	spec := &corev1.PodSpec{}
	skip := func(t *corev1.Taint) bool { return strings.HasPrefix(t.Key, "node.kubernetes.io/") }
	if got, ok := Untolerated(spec, n, skip); !ok || got.Key != "dedicated" {
		t.Fatalf("Untolerated = %+v, %v; want dedicated", got, ok)
	}
	if got, ok := Untolerated(spec, n, nil); !ok || got.Key != "node.kubernetes.io/out-of-service" {
		t.Fatalf("Untolerated without skip = %+v, %v", got, ok)
	}
}
