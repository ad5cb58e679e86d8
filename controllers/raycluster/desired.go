package raycluster

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/common"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
)

// Labels and annotations Loom adds to what KubeRay's builders produce.
const (
	// AnnotationTemplateHash is the template stamp of the pod (see stamp);
	// a pod that is not current with what the builders make now is rolled.
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

// buildHeadPod is KubeRay's head pod (its builders: template, ray start
// command, env, ports, probes, autoscaler sidecar) plus Loom's ownership,
// template hash and gang membership.
func buildHeadPod(ctx context.Context, rc *rayv1.RayCluster, pg string) *corev1.Pod {
	spec := specHash(rc, nil)
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
	return ownPod(rc, &pod, pg, headGroup, spec)
}

// buildWorkerPod is KubeRay's worker pod of group g, as above.
func buildWorkerPod(ctx context.Context, rc *rayv1.RayCluster, g *rayv1.WorkerGroupSpec, pg string) *corev1.Pod {
	spec := specHash(rc, g)
	rc, g = rc.DeepCopy(), g.DeepCopy() // KubeRay's builders write into rayStartParams
	podName := utils.PodName(fmt.Sprintf("%s-%s", rc.Name, g.GroupName), rayv1.WorkerNode, true)
	fqdn := utils.GenerateFQDNServiceName(ctx, *rc, rc.Namespace)
	headPort := common.GetHeadPort(rc.Spec.HeadGroupSpec.RayStartParams)
	// The replica-group name and indexes matter only for multi-host
	// indexing, which Loom does not enable.
	tmpl := common.DefaultWorkerPodTemplate(ctx, *rc, *g, podName, fqdn, headPort, "", 0, 0)
	pod := common.BuildPod(ctx, tmpl, rayv1.WorkerNode, g.RayStartParams, headPort,
		utils.IsAutoscalingEnabled(&rc.Spec), utils.RayClusterCRD, fqdn, nil)
	return ownPod(rc, &pod, pg, g.GroupName, spec)
}

// The template stamp a pod carries (AnnotationTemplateHash) is three
// fields, "<pod>/<spec>/<builders>":
//   - pod: the hash of the pod as KubeRay's builders made it (before Loom's
//     part): its name or name prefix, labels, annotations and spec. So every
//     input the builders read rolls the pods when it changes: a field of the
//     group, the head's port and Service that workers dial, the cluster's
//     annotations (ray.io/ft-enabled), gcsFaultToleranceOptions, the Ray
//     version, the autoscaler. Its gang (the PodGroup) is not part of it.
//   - spec: the hash of what the builders were given for the pod (specHash).
//   - builders: the version of KubeRay's builders.
//
// A pod built by other builders (Loom upgraded to a newer KubeRay) makes a
// different pod from the same spec; it is rolled only when its spec
// changed, so that an upgrade of Loom restarts no Ray cluster. A pod of a
// Loom from before the stamp carries a hash of its group's spec alone
// (legacyHash): it is current while that hash is the same.
type stamp struct{ pod, spec, builders string }

func (s stamp) String() string { return s.pod + "/" + s.spec + "/" + s.builders }

func parseStamp(v string) stamp {
	f := strings.SplitN(v, "/", 3)
	f = append(f, "", "", "")
	return stamp{f[0], f[1], f[2]}
}

// builtFrom: a pod stamped have is current with the template want stamps;
// legacy is the group's legacyHash.
func builtFrom(have string, want stamp, legacy string) bool {
	if !strings.Contains(have, "/") {
		return have != "" && have == legacy
	}
	h := parseStamp(have)
	return h.pod == want.pod || h.builders != want.builders && h.spec == want.spec && h.spec != ""
}

// builders is the version of KubeRay's ray-operator module (go.mod's) whose
// builders make the pods; a test holds it to go.mod.
func builders() string { return "v1.5.0" }

// specHash is the spec field of a stamp for the head (g nil) or group g:
// what the builders read of the cluster, less what shapes no pod. That is
// its name, its ray.io/ annotations (the only ones they read: not
// kubectl's last-applied configuration, nor labels), its spec without
// replica counts, suspension and the other groups; of the head, a worker
// reads only what reaches its ray start command (the head's
// rayStartParams and Service).
func specHash(rc *rayv1.RayCluster, g *rayv1.WorkerGroupSpec) string {
	spec := rc.Spec.DeepCopy()
	spec.Suspend, spec.WorkerGroupSpecs = nil, nil
	if g != nil {
		g = g.DeepCopy()
		g.Replicas, g.MinReplicas, g.MaxReplicas, g.Suspend = nil, nil, nil, nil
		g.ScaleStrategy = rayv1.ScaleStrategy{}
		spec.WorkerGroupSpecs = []rayv1.WorkerGroupSpec{*g}
		spec.HeadGroupSpec = rayv1.HeadGroupSpec{RayStartParams: spec.HeadGroupSpec.RayStartParams, HeadService: spec.HeadGroupSpec.HeadService}
	}
	ann := map[string]string{}
	for k, v := range rc.Annotations {
		if strings.HasPrefix(k, "ray.io/") {
			ann[k] = v
		}
	}
	return apply.Hash([]any{rc.Name, ann, spec})
}

// legacyHash is the template hash of a Loom from before the stamp: of the
// head's (g nil) or group g's spec.
func legacyHash(rc *rayv1.RayCluster, g *rayv1.WorkerGroupSpec) string {
	if g == nil {
		return apply.Hash([]any{rc.Spec.HeadGroupSpec, rc.Spec.RayVersion, rc.Spec.EnableInTreeAutoscaling, rc.Spec.AutoscalerOptions})
	}
	return apply.Hash([]any{g.Template, g.RayStartParams, g.NumOfHosts, rc.Spec.RayVersion, rc.Spec.EnableInTreeAutoscaling})
}

// ownPod adds Loom's part to a pod KubeRay's builders made: the cluster's
// ownership, the managed-by label, the template stamp (spec: its spec
// field) and the gang membership (pg: the PodGroup, "" for none).
func ownPod(rc *rayv1.RayCluster, pod *corev1.Pod, pg, task, spec string) *corev1.Pod {
	hash := stamp{apply.Hash([]any{pod.Name, pod.GenerateName, pod.Labels, pod.Annotations, pod.Spec}), spec, builders()}.String()
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

// buildChildren are the cluster's children: the head Service, with a
// multi-host worker group the headless worker Service, with the
// ray.io/enable-serve-service annotation the serve Service, and with
// headGroupSpec.enableIngress the dashboard's Ingress; shared, with the
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
	if rc.Annotations[utils.EnableServeServiceKey] == utils.EnableServeServiceTrue {
		// <cluster>-serve-svc, the head container's serve port, selecting
		// every pod of the cluster (Ray Serve's proxies answer on each).
		svc, err := common.BuildServeServiceForRayCluster(ctx, *rc)
		if err != nil {
			return nil, nil, err
		}
		children = append(children, service(svc))
	}
	if ptr.Deref(rc.Spec.HeadGroupSpec.EnableIngress, false) {
		// <cluster>-head-ingress to the head Service's dashboard port, the
		// cluster's annotations for it, its class from
		// kubernetes.io/ingress.class.
		ing, err := common.BuildIngressForHeadService(ctx, *rc)
		if err != nil {
			return nil, nil, err
		}
		maps.DeleteFunc(ing.Annotations, func(k, _ string) bool { return !forIngress(k) })
		ing.TypeMeta = metav1.TypeMeta{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: "Ingress"}
		children = append(children, ing)
	}
	if utils.IsAutoscalingEnabled(&rc.Spec) {
		shared, err = autoscalerRBAC(rc)
	}
	return children, shared, err
}

// notForIngress are the annotation domains of a RayCluster that say
// something of the cluster itself, not of its Ingress: kubectl's
// (last-applied-configuration, the whole RayCluster), KubeRay's ray.io
// (the cluster's options), Loom's, and the ownership marks of Helm and Argo
// CD, which would claim the Ingress for a release or an application that
// does not render it.
var notForIngress = []string{"kubectl.kubernetes.io", "ray.io", "loom.dev", "meta.helm.sh", "argocd.argoproj.io"}

// forIngress reports whether the cluster's annotation key goes on its
// dashboard Ingress. As KubeRay's builder, every other annotation does
// (but the class, which becomes ingressClassName), so that an Ingress
// controller's own, whatever the controller (nginx.ingress.kubernetes.io/,
// alb.ingress.kubernetes.io/, cert-manager.io/, kubernetes.io/ingress.*),
// reach it.
func forIngress(key string) bool {
	domain, _, ok := strings.Cut(key, "/")
	if !ok {
		return true
	}
	for _, d := range notForIngress {
		if domain == d || strings.HasSuffix(domain, "."+d) {
			return false
		}
	}
	return true
}

// unwantedChildren are the optional children (the headless worker
// Service, the serve Service, the dashboard Ingress, the autoscaler's
// ServiceAccount, Role and RoleBinding) that wanted, the cluster's
// children and shared ones, lacks, named and typed to look for (the Role
// and RoleBinding as metadata, as they are cached), and the head Services
// of old names. A ServiceAccount that a pod template names stays: its
// pods would be refused without it.
func unwantedChildren(rc *rayv1.RayCluster, wanted []client.Object, oldHeads []*corev1.Service) []client.Object {
	svc := metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	rbac := func(kind string) client.Object {
		m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: rc.Name}}
		m.SetGroupVersionKind(rbacv1.SchemeGroupVersion.WithKind(kind))
		return m
	}
	optional := []client.Object{
		&corev1.Service{TypeMeta: svc, ObjectMeta: metav1.ObjectMeta{Name: rc.Name + "-" + utils.HeadlessServiceSuffix}},
		&corev1.Service{TypeMeta: svc, ObjectMeta: metav1.ObjectMeta{Name: utils.GenerateServeServiceName(rc.Name)}},
		&networkingv1.Ingress{TypeMeta: metav1.TypeMeta{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: "Ingress"},
			ObjectMeta: metav1.ObjectMeta{Name: utils.GenerateIngressName(rc.Name)}},
		rbac("Role"), rbac("RoleBinding"),
	}
	if !namesServiceAccount(rc, rc.Name) {
		optional = append(optional, &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: metav1.ObjectMeta{Name: rc.Name}})
	}
	var out []client.Object
	for _, o := range optional {
		o.SetNamespace(rc.Namespace)
		if !slices.ContainsFunc(wanted, func(c client.Object) bool {
			return c.GetName() == o.GetName() && c.GetObjectKind().GroupVersionKind().Kind == o.GetObjectKind().GroupVersionKind().Kind
		}) {
			out = append(out, o)
		}
	}
	for _, svc := range oldHeads {
		out = append(out, svc)
	}
	return out
}

// namesServiceAccount: a pod template of the cluster names ServiceAccount
// sa.
func namesServiceAccount(rc *rayv1.RayCluster, sa string) bool {
	if rc.Spec.HeadGroupSpec.Template.Spec.ServiceAccountName == sa {
		return true
	}
	return slices.ContainsFunc(rc.Spec.WorkerGroupSpecs, func(g rayv1.WorkerGroupSpec) bool { return g.Template.Spec.ServiceAccountName == sa })
}

// buildHeadService is KubeRay's head Service (<cluster>-head-svc, headless
// by default, ports gcs-server, dashboard, client, metrics, serve).
func buildHeadService(ctx context.Context, rc *rayv1.RayCluster) (*corev1.Service, error) {
	labels := common.HeadServiceLabels(*rc)
	// A copy: the writer adds its hash to the Service's annotations.
	svc, err := common.BuildServiceForHeadPod(ctx, *rc, labels, maps.Clone(rc.Spec.HeadServiceAnnotations))
	if err != nil {
		return nil, err
	}
	return service(svc), nil
}

// headServiceWhat names the head Service in a refusal: the fields the API
// server quotes are the Service's, as KubeRay builds it.
const headServiceWhat = "the head Service (spec.headGroupSpec.headService, the head container's ports after its own, and serviceType)"

// headServicePrototype is the head Service for the preflight: as
// buildHeadService builds it, but with the ports of
// spec.headGroupSpec.headService first and at their own indexes, so that
// the API server's causes name them as the user wrote them; nil when it
// cannot be built.
func headServicePrototype(ctx context.Context, rc *rayv1.RayCluster) *corev1.Service {
	svc, err := common.BuildServiceForHeadPod(ctx, *rc, common.HeadServiceLabels(*rc), rc.Spec.HeadServiceAnnotations)
	if err != nil {
		return nil
	}
	own := 0
	if hs := rc.Spec.HeadGroupSpec.HeadService; hs != nil {
		own = len(hs.Spec.Ports)
	}
	sortPorts(svc.Spec.Ports[own:]) // KubeRay's, from a map
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	// As the writer makes it: controlled by the cluster (a policy may read
	// its owners).
	svc.OwnerReferences = []metav1.OwnerReference{ownerRef(rc)}
	return svc
}

// service gives a Service KubeRay built its kind and its ports one order:
// KubeRay builds a custom head Service's from a map, and the writer's hash
// must not change with the map's order.
func service(svc *corev1.Service) *corev1.Service {
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	sortPorts(svc.Spec.Ports)
	return svc
}

func sortPorts(ports []corev1.ServicePort) {
	slices.SortStableFunc(ports, func(a, b corev1.ServicePort) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port))
	})
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
