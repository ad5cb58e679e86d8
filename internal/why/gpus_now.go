package why

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	inv "github.com/loom-dev/loom/internal/inventory" // the package's tests name a helper inventory
	"github.com/loom-dev/loom/internal/sharing"
)

// WaitsToBeScheduled says whether a TrainingJob has not finished and its
// gang is not scheduled yet: the jobs whose answer the live GPU picture
// completes (TrainingJobGPUsNow).
func WaitsToBeScheduled(tj *trainingv1alpha1.TrainingJob) bool {
	return !tj.Status.Finished() && !meta.IsStatusConditionTrue(tj.Status.Conditions, trainingv1alpha1.ConditionScheduled)
}

// TrainingJobGPUsNow is the live picture behind a waiting job's verdict,
// which the job's status leaves out so that it is not rewritten whenever a
// GPU elsewhere is allocated or freed: the inventory's answer for the
// job's gang over the nodes, GPUNodes and bound pods given (what kubectl
// loom gpus reads) and the ClusterPolicy's sharing configs, the way the
// manager computes it. For example "GPUs
// now: nvidia.com/gpu: 24 free on 3 nodes, 32 in the cluster; 3 nodes have
// 8 free, 1 has none; 8 more on 1 cordoned node". Empty when the gang asks
// for no GPUs or the cluster has none of what it asks.
func TrainingJobGPUsNow(tj *trainingv1alpha1.TrainingJob, src sharing.Source, nodes []corev1.Node, gpuNodes []gpuv1alpha1.GPUNode, pods []corev1.Pod) string {
	x := inv.NewIndex()
	x.SetSharing(src)
	for i := range nodes {
		x.SetNode(&nodes[i])
	}
	for i := range gpuNodes {
		x.SetGPUNode(&gpuNodes[i])
	}
	for i := range pods {
		x.SetPod(&pods[i])
	}
	if now := x.Fits(jobGang(tj)).Now; now != "" {
		return "GPUs now: " + now
	}
	return ""
}

// jobGang is the job's gang as the training reconciler asks the inventory
// about it: the master, then the workers, every GPU resource of each.
func jobGang(tj *trainingv1alpha1.TrainingJob) inv.Gang {
	g := inv.Gang{Groups: inv.PodGroups(1, &tj.Spec.ReplicaSpecs.Master.Template.Spec)}
	if w := tj.Spec.ReplicaSpecs.Worker; w != nil && tj.Spec.Workers() > 0 {
		g.Groups = append(g.Groups, inv.PodGroups(int64(tj.Spec.Workers()), &w.Template.Spec)...)
	}
	return g
}
