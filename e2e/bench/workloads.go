package bench

import (
	"context"
	"fmt"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

func gpuTemplate(gpus string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "pytorch", Image: "pytorch/pytorch:2.5.1",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{framework.GPUResource: resource.MustParse(gpus)}}}}}}
}

// trainingJob is a master and workers, gpus GPUs each.
func trainingJob(ns, name string, workers int32, gpus string) *trainingv1alpha1.TrainingJob {
	return &trainingv1alpha1.TrainingJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: trainingv1alpha1.TrainingJobSpec{ReplicaSpecs: trainingv1alpha1.ReplicaSpecs{
			Master: trainingv1alpha1.ReplicaSpec{Template: gpuTemplate(gpus)},
			Worker: &trainingv1alpha1.ReplicaSpec{Replicas: ptr.To(workers), Template: gpuTemplate(gpus)},
		}},
	}
}

// RayCluster is the benchmark's cluster: a head and 3 CPU workers.
func RayCluster(ns, name string) *rayv1.RayCluster {
	res := func(cpu, mem string) corev1.ResourceRequirements {
		l := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
		return corev1.ResourceRequirements{Requests: l, Limits: l}
	}
	return &rayv1.RayCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: rayv1.RayClusterSpec{
			RayVersion: "2.46.0",
			HeadGroupSpec: rayv1.HeadGroupSpec{RayStartParams: map[string]string{}, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "ray-head", Image: "rayproject/ray:2.46.0", Resources: res("1", "2Gi")}}}}},
			WorkerGroupSpecs: []rayv1.WorkerGroupSpec{{
				GroupName: "workers", Replicas: ptr.To[int32](3), MinReplicas: ptr.To[int32](0), MaxReplicas: ptr.To[int32](10),
				RayStartParams: map[string]string{},
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "ray-worker", Image: "rayproject/ray:2.46.0", Resources: res("1", "1Gi")}}}},
			}},
		},
	}
}

// createRayClusters creates rc-0 … rc-(n-1) in ns.
//
// They are created 32 at a time: one at a time, the creates alone (a
// RayCluster is a large object of a CRD with a large schema) took about
// 6.7 s of 100 clusters' 10–14 s to ready, the same for every contender,
// and so hid the operators' difference.
func createRayClusters(ctx context.Context, c *framework.Cluster, ns string, n int) error {
	return parallel(n, func(i int) error { return c.Client.Create(ctx, RayCluster(ns, fmt.Sprintf("rc-%d", i))) })
}

// applyPolicy creates cp and waits until it is Ready on at least gpuNodes
// GPU nodes, returning how long that took.
func applyPolicy(ctx context.Context, c *framework.Cluster, cp *gpuv1alpha1.ClusterPolicy, gpuNodes int, timeout time.Duration) (time.Duration, error) {
	applied := time.Now()
	if err := c.Client.Create(ctx, cp); err != nil {
		return 0, err
	}
	err := poll(ctx, c, 200*time.Millisecond, timeout, func() (bool, string, error) {
		if err := c.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			return false, "", err
		}
		return cp.Status.State == gpuv1alpha1.PolicyReady && int(cp.Status.GPUNodes) >= gpuNodes,
			fmt.Sprintf("policy %s on %d GPU nodes: %+v", cp.Status.State, cp.Status.GPUNodes, cp.Status.Conditions), nil
	})
	return time.Since(applied), err
}
