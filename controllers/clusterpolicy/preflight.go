package clusterpolicy

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/preflight"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=create

// unknownUID stands for the UID of an owner a dry run cannot know.
const unknownUID types.UID = "00000000-0000-0000-0000-000000000000"

// refused says what the API server refuses in the pods of the policy's
// DaemonSets (an env var name, a toleration's operator or effect, requests
// above limits, a quantity, an image with spaces): a dry-run create of one
// pod of each operand's first DaemonSet, kept per pod shape
// (internal/preflight), so an unchanged policy asks nothing. The driver's
// other DaemonSets differ only in what Loom builds (the image tag per OS,
// the nodes). Each cause names the DaemonSet and the pod field.
func (r *Reconciler) refused(ctx context.Context, p plan) []string {
	asked := map[string]bool{}
	var out []string
	for _, obj := range p.objects {
		ds, ok := obj.(*appsv1.DaemonSet)
		if !ok || asked[ds.Labels[gpuv1alpha1.LabelComponent]] {
			continue
		}
		asked[ds.Labels[gpuv1alpha1.LabelComponent]] = true
		if why := preflight.Refused(ctx, r.Client, "", "DaemonSet "+ds.Name+": pod", templatePod(ds)); why != "" {
			out = append(out, why)
		}
	}
	return out
}

// templatePod is a pod of ds's template, without what admission looks up
// before it validates (the ServiceAccount, the RuntimeClass, the
// PriorityClass: Loom's, made in the same pass, or checked by Validate),
// whose absence would answer Forbidden and say nothing of the rest. It is
// controlled by its DaemonSet, as the DaemonSet controller makes it (an
// admission policy that pods have a controller admits it), under a UID no
// dry run can know and without blockOwnerDeletion, which that controller
// sets, not Loom.
func templatePod(ds *appsv1.DaemonSet) *corev1.Pod {
	t := ds.Spec.Template.DeepCopy()
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: unknownUID, Controller: ptr.To(true)}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: ds.Name, Namespace: ds.Namespace, Labels: t.Labels, Annotations: t.Annotations,
		OwnerReferences: []metav1.OwnerReference{owner}}, Spec: t.Spec}
	pod.Spec.ServiceAccountName, pod.Spec.RuntimeClassName, pod.Spec.PriorityClassName = "", nil, ""
	pod.Spec.AutomountServiceAccountToken = ptr.To(false)
	return pod
}
