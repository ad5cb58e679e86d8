package clusterpolicy

import (
	"testing"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// With health.taintUnhealthyNodes the labeller taints a node
// nvidia.com/gpu.unhealthy=<reason>:NoSchedule. The policy's own operands
// must tolerate that taint: otherwise the DaemonSet controller will not
// (re)create an operand pod on the node, e.g. the driver pod the driver
// upgrade deletes in pod-restart-required, or a device plugin pod replaced
// by a config rollout.
func TestOperandsTolerateTheUnhealthyTaint(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", UID: "uid"}}
	cp.Spec.Health.TaintUnhealthyNodes = true
	taint := corev1.Taint{Key: gpuv1alpha1.TaintUnhealthy, Value: "Xid-79", Effect: corev1.TaintEffectNoSchedule}
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-0", Labels: map[string]string{
		gpuv1alpha1.LabelPresent: "true", gpuv1alpha1.LabelOSReleaseID: "ubuntu", gpuv1alpha1.LabelOSReleaseVersionID: "22.04"}}}
	p := desired(cp, "loom-system", cluster{nodes: []corev1.Node{node}})
	n := 0
	for _, obj := range p.objects {
		d, isDS := obj.(*appsv1.DaemonSet)
		if !isDS {
			continue
		}
		n++
		tolerated := false
		for _, tol := range d.Spec.Template.Spec.Tolerations {
			if tol.ToleratesTaint(logr.Discard(), &taint, false) {
				tolerated = true
			}
		}
		if !tolerated {
			t.Errorf("DaemonSet %s does not tolerate Loom's own taint %s=%s:%s: its pods are not recreated on a tainted GPU node",
				d.Name, taint.Key, taint.Value, taint.Effect)
		}
	}
	if n == 0 {
		t.Fatal("no DaemonSets")
	}
}
