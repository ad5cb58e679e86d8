package raycluster

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/common"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
)

// Labels and annotations Loom adds to what KubeRay's builders produce.
const (
	// AnnotationTemplateHash is the hash of the group's spec a pod was built
	// from; a pod whose hash differs from the group's is rolled.
	AnnotationTemplateHash = "loom.dev/ray-template-hash"
	// LabelScheduler and the two below are KubeRay's gang-scheduling labels
	// on the RayCluster.
	LabelScheduler     = "ray.io/scheduler-name"
	LabelQueue         = "volcano.sh/queue-name"
	LabelPriorityClass = "ray.io/priority-class-name"
	// headGroup is the value of ray.io/group on the head pod.
	headGroup = "headgroup"
)

// normalized returns a copy of the cluster with the defaults the CRD would
// apply filled in, so that KubeRay's helpers (which dereference them) never
// see nil.
func normalized(rc *rayv1.RayCluster) *rayv1.RayCluster {
	rc = rc.DeepCopy()
	if rc.Spec.HeadGroupSpec.RayStartParams == nil {
		rc.Spec.HeadGroupSpec.RayStartParams = map[string]string{}
	}
	for i := range rc.Spec.WorkerGroupSpecs {
		g := &rc.Spec.WorkerGroupSpecs[i]
		if g.RayStartParams == nil {
			g.RayStartParams = map[string]string{}
		}
		if g.MinReplicas == nil {
			g.MinReplicas = ptr.To[int32](0)
		}
		if g.MaxReplicas == nil {
			g.MaxReplicas = ptr.To[int32](2147483647)
		}
		if g.NumOfHosts < 1 {
			g.NumOfHosts = 1
		}
		if g.Replicas == nil {
			g.Replicas = ptr.To(*g.MinReplicas)
		}
	}
	return rc
}

// headHash covers what shapes the head pod.
func headHash(rc *rayv1.RayCluster) string {
	return apply.Hash([]any{rc.Spec.HeadGroupSpec, rc.Spec.RayVersion, rc.Spec.EnableInTreeAutoscaling, rc.Spec.AutoscalerOptions})
}

// groupHash covers what shapes one worker group's pods (not its replica
// counts).
func groupHash(rc *rayv1.RayCluster, g *rayv1.WorkerGroupSpec) string {
	return apply.Hash([]any{g.Template, g.RayStartParams, g.NumOfHosts, rc.Spec.RayVersion, rc.Spec.EnableInTreeAutoscaling})
}

// buildHeadPod is KubeRay's head pod (its builders: template, ray start
// command, env, ports, probes, autoscaler sidecar) plus Loom's ownership,
// template hash and gang membership.
func buildHeadPod(ctx context.Context, rc *rayv1.RayCluster, pg string) *corev1.Pod {
	hash := headHash(rc)
	rc = rc.DeepCopy() // KubeRay's builders write into rayStartParams
	// With KubeRay's ENABLE_DETERMINISTIC_HEAD_POD_NAME the head pod has a
	// fixed name (a pod of the name that is not the cluster's is a
	// podset.ConflictError), else a generated one.
	podName := utils.PodName(rc.Name, rayv1.HeadNode, !utils.IsDeterministicHeadPodNameEnabled())
	fqdn := utils.GenerateFQDNServiceName(ctx, *rc, rc.Namespace)
	headPort := common.GetHeadPort(rc.Spec.HeadGroupSpec.RayStartParams)
	tmpl := common.DefaultHeadPodTemplate(ctx, *rc, rc.Spec.HeadGroupSpec, podName, headPort)
	pod := common.BuildPod(ctx, tmpl, rayv1.HeadNode, rc.Spec.HeadGroupSpec.RayStartParams, headPort,
		utils.IsAutoscalingEnabled(&rc.Spec), utils.RayClusterCRD, fqdn, nil)
	return ownPod(rc, &pod, hash, pg, headGroup)
}

// buildWorkerPod is KubeRay's worker pod of group g, as above.
func buildWorkerPod(ctx context.Context, rc *rayv1.RayCluster, g *rayv1.WorkerGroupSpec, pg string) *corev1.Pod {
	hash := groupHash(rc, g)
	rc, g = rc.DeepCopy(), g.DeepCopy() // KubeRay's builders write into rayStartParams
	podName := utils.PodName(fmt.Sprintf("%s-%s", rc.Name, g.GroupName), rayv1.WorkerNode, true)
	fqdn := utils.GenerateFQDNServiceName(ctx, *rc, rc.Namespace)
	headPort := common.GetHeadPort(rc.Spec.HeadGroupSpec.RayStartParams)
	// The replica-group name and indexes matter only for multi-host
	// indexing, which Loom does not enable.
	tmpl := common.DefaultWorkerPodTemplate(ctx, *rc, *g, podName, fqdn, headPort, "", 0, 0)
	pod := common.BuildPod(ctx, tmpl, rayv1.WorkerNode, g.RayStartParams, headPort,
		utils.IsAutoscalingEnabled(&rc.Spec), utils.RayClusterCRD, fqdn, nil)
	return ownPod(rc, &pod, hash, pg, g.GroupName)
}

// ownPod adds Loom's part to a pod KubeRay's builders made: the cluster's
// ownership, the managed-by label, the template hash and the gang
// membership (pg: the PodGroup, "" for none).
func ownPod(rc *rayv1.RayCluster, pod *corev1.Pod, hash, pg, task string) *corev1.Pod {
	pod.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	pod.Namespace = rc.Namespace
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationTemplateHash] = hash
	pod.Labels = maps.Clone(pod.Labels)
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[apply.LabelManagedBy] = apply.ManagedBy
	pod.OwnerReferences = []metav1.OwnerReference{ownerRef(rc)}
	if pg != "" {
		gang.Join(pod, pg, task)
	}
	return pod
}

func ownerRef(rc *rayv1.RayCluster) metav1.OwnerReference {
	return *metav1.NewControllerRef(rc, rayv1.SchemeGroupVersion.WithKind("RayCluster"))
}

// buildChildren are the cluster's children: the head Service and, with a
// multi-host worker group, the headless worker Service; shared, with the
// autoscaler, its ServiceAccount (unless the head names one), Role and
// RoleBinding, as KubeRay makes them. The writer adds the owner reference
// and the managed-by label.
func buildChildren(ctx context.Context, rc *rayv1.RayCluster) (children, shared []client.Object, err error) {
	head, err := buildHeadService(ctx, rc)
	if err != nil {
		return nil, nil, err
	}
	children = append(children, head)
	for _, g := range rc.Spec.WorkerGroupSpecs {
		if g.NumOfHosts > 1 {
			children = append(children, service(common.BuildHeadlessServiceForRayCluster(*rc)))
			break
		}
	}
	if utils.IsAutoscalingEnabled(&rc.Spec) {
		shared, err = autoscalerRBAC(rc)
	}
	return children, shared, err
}

// buildHeadService is KubeRay's head Service (<cluster>-head-svc, headless
// by default, ports gcs-server, dashboard, client, metrics, serve).
func buildHeadService(ctx context.Context, rc *rayv1.RayCluster) (*corev1.Service, error) {
	labels := common.HeadServiceLabels(*rc)
	svc, err := common.BuildServiceForHeadPod(ctx, *rc, labels, rc.Spec.HeadServiceAnnotations)
	if err != nil {
		return nil, err
	}
	return service(svc), nil
}

// service gives a Service KubeRay built its kind and its ports one order:
// KubeRay builds a custom head Service's from a map, and the writer's hash
// must not change with the map's order.
func service(svc *corev1.Service) *corev1.Service {
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	slices.SortStableFunc(svc.Spec.Ports, func(a, b corev1.ServicePort) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port))
	})
	return svc
}

// autoscalerRBAC is the autoscaler's ServiceAccount (only when the head
// template names none), Role and RoleBinding, as KubeRay builds them.
func autoscalerRBAC(rc *rayv1.RayCluster) ([]client.Object, error) {
	var objs []client.Object
	if rc.Spec.HeadGroupSpec.Template.Spec.ServiceAccountName == "" {
		sa, err := common.BuildServiceAccount(rc)
		if err != nil {
			return nil, err
		}
		sa.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}
		objs = append(objs, sa)
	}
	role, err := common.BuildRole(rc)
	if err != nil {
		return nil, err
	}
	role.TypeMeta = metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "Role"}
	rb, err := common.BuildRoleBinding(rc)
	if err != nil {
		return nil, err
	}
	rb.TypeMeta = metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "RoleBinding"}
	return append(objs, role, rb), nil
}

// podGroupName is KubeRay's name for a cluster's Volcano PodGroup.
func podGroupName(rc *rayv1.RayCluster) string { return fmt.Sprintf("ray-%s-pg", rc.Name) }

// gangSpec is the cluster's gang: the head and each worker group's required
// pods (minReplicas with the autoscaler, else the desired count), built as
// KubeRay builds them, so minResources counts the autoscaler sidecar and the
// injected init containers.
func gangSpec(ctx context.Context, rc *rayv1.RayCluster) gang.Spec {
	pg := podGroupName(rc)
	s := gang.Spec{
		Name: pg, Namespace: rc.Namespace,
		Labels:            map[string]string{utils.RayClusterLabelKey: rc.Name},
		Owner:             ownerRef(rc),
		Queue:             rc.Labels[LabelQueue],
		PriorityClassName: rc.Labels[LabelPriorityClass],
	}
	if s.Queue == "" {
		s.Queue = "default"
	}
	head := buildHeadPod(ctx, rc, pg)
	s.Tasks = append(s.Tasks, gang.Task{Name: headGroup, Count: 1, Min: 1, Spec: &head.Spec})
	auto := utils.IsAutoscalingEnabled(&rc.Spec)
	for i := range rc.Spec.WorkerGroupSpecs {
		g := &rc.Spec.WorkerGroupSpecs[i]
		desired := clamp32(groupPods(g))
		need := desired
		if auto {
			need = min(clamp32(minPods(g)), desired)
		}
		w := buildWorkerPod(ctx, rc, g, pg)
		s.Tasks = append(s.Tasks, gang.Task{Name: g.GroupName, Count: desired, Min: need, Spec: &w.Spec})
	}
	return s
}
