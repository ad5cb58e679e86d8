package raycluster

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
)

// Loom's own condition types on a RayCluster, beside KubeRay's.
const (
	// ConditionGang: the gang scheduler the cluster asked for is usable.
	ConditionGang = "loom.dev/GangScheduling"
	// ConditionGPUs: every group's pods fit some node of this cluster.
	ConditionGPUs = "loom.dev/GPUInventory"
	// ConditionValid: the spec passes KubeRay's validation.
	ConditionValid = "loom.dev/SpecValid"
)

// observed is what one reconcile sees.
type observed struct {
	// pods of the cluster (cache plus expectations).
	pods []*corev1.Pod
	// headService is the head Service, nil when absent.
	headService *corev1.Service
	podGroup    *schedulingv1beta1.PodGroup
	volcano     bool
	// fits per group name (head and workers): the inventory's verdict on
	// one pod of the group.
	fits map[string]inventory.FitResult
	// invalid is KubeRay's validation error, if any.
	invalid error
	now     time.Time
}

// decision is what the reconcile must do.
type decision struct {
	status         rayv1.RayClusterStatus
	create         []*corev1.Pod
	remove         []*corev1.Pod
	children       bool // Services, RBAC, PodGroup wanted
	gang           bool // a PodGroup wanted
	removePodGroup bool
	events         []event
}

type event struct {
	warning     bool
	reason, msg string
}

// group is one pod group of the cluster as decide sees it.
type group struct {
	name    string
	desired int32
	hash    string
	spec    *rayv1.WorkerGroupSpec // nil for the head
	pods    []*corev1.Pod          // live (not terminating, not finished)
}

func setCond(st *rayv1.RayClusterStatus, t string, s metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)})
}

// decide computes the cluster's next pods and status from what was observed.
// rc is normalized (defaults filled in).
func decide(ctx context.Context, rc *rayv1.RayCluster, obs observed, sched string) decision {
	d := decision{status: *rc.Status.DeepCopy()}
	st, gen, now := &d.status, rc.Generation, obs.now
	st.ObservedGeneration = gen

	if obs.invalid != nil {
		setCond(st, ConditionValid, metav1.ConditionFalse, "InvalidSpec", obs.invalid.Error(), gen, now)
		setState(st, "", now)
		return d
	}
	meta.RemoveStatusCondition(&st.Conditions, ConditionValid)

	// Finished or failed pods are deleted (restartPolicy Never leaves them)
	// and replaced; terminating ones count for nothing.
	byGroup := map[string][]*corev1.Pod{}
	for _, p := range obs.pods {
		switch {
		case p.DeletionTimestamp != nil:
		case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
			d.remove = append(d.remove, p)
		default:
			byGroup[groupOf(p)] = append(byGroup[groupOf(p)], p)
		}
	}

	if rc.Spec.Suspend != nil && *rc.Spec.Suspend {
		return suspend(rc, obs, d)
	}
	if meta.IsStatusConditionTrue(st.Conditions, string(rayv1.RayClusterSuspended)) || meta.IsStatusConditionTrue(st.Conditions, string(rayv1.RayClusterSuspending)) {
		setCond(st, string(rayv1.RayClusterSuspended), metav1.ConditionFalse, "Resumed", "spec.suspend is false", gen, now)
		setCond(st, string(rayv1.RayClusterSuspending), metav1.ConditionFalse, "Resumed", "spec.suspend is false", gen, now)
	}

	gangPG := ""
	if sched == "volcano" {
		if !obs.volcano {
			msg := "the cluster asks for Volcano (label " + LabelScheduler + " or the manager's --gang-scheduler) but Volcano's PodGroup CRD is not installed: no pods are created until it is; install Volcano, or label the cluster " + LabelScheduler + "=none"
			setCond(st, ConditionGang, metav1.ConditionFalse, "VolcanoNotInstalled", msg, gen, now)
			setState(st, "", now)
			status(ctx, rc, obs, byGroup, st)
			return d
		}
		gangPG = podGroupName(rc)
		d.gang = true
		setCond(st, ConditionGang, metav1.ConditionTrue, "PodGroupCreated", fmt.Sprintf("gang-scheduled by Volcano through PodGroup %s", gangPG), gen, now)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, ConditionGang)
		d.removePodGroup = obs.podGroup != nil
	}
	d.children = true

	inventoryCondition(rc, obs, &d)

	groups := []*group{{name: headGroup, desired: 1, hash: headHash(rc), pods: byGroup[headGroup]}}
	for i := range rc.Spec.WorkerGroupSpecs {
		g := &rc.Spec.WorkerGroupSpecs[i]
		groups = append(groups, &group{name: g.GroupName, desired: utils.GetWorkerGroupDesiredReplicas(ctx, *g), hash: groupHash(rc, g), spec: g, pods: byGroup[g.GroupName]})
	}
	// Pods of groups that no longer exist go.
	known := map[string]bool{}
	for _, g := range groups {
		known[g.name] = true
	}
	for name, pods := range byGroup {
		if !known[name] {
			d.remove = append(d.remove, pods...)
		}
	}

	// Rollout: the head first (workers need its GCS), then the worker
	// groups in spec order; a group's outdated pods are recreated only once
	// every group before it is up to date and ready, so one group at a time
	// restarts.
	rolling := false
	for _, g := range groups {
		scale(ctx, rc, g, gangPG, &d, rolling)
		if !groupSettled(g) {
			rolling = true
		}
	}
	status(ctx, rc, obs, byGroup, st)
	return d
}

func groupOf(p *corev1.Pod) string {
	if p.Labels[utils.RayNodeTypeLabelKey] == string(rayv1.HeadNode) {
		return headGroup
	}
	return p.Labels[utils.RayNodeGroupLabelKey]
}

// scale makes one group's pods match its desired count and template.
func scale(ctx context.Context, rc *rayv1.RayCluster, g *group, pg string, d *decision, holdRollout bool) {
	live := g.pods
	// workersToDelete: the autoscaler's (or a user's) choice of pods to go.
	if g.spec != nil && len(g.spec.ScaleStrategy.WorkersToDelete) > 0 {
		drop := map[string]bool{}
		for _, n := range g.spec.ScaleStrategy.WorkersToDelete {
			drop[n] = true
		}
		var keep []*corev1.Pod
		for _, p := range live {
			if drop[p.Name] {
				d.remove = append(d.remove, p)
			} else {
				keep = append(keep, p)
			}
		}
		live = keep
	}
	var current, outdated []*corev1.Pod
	for _, p := range live {
		if p.Annotations[AnnotationTemplateHash] == g.hash {
			current = append(current, p)
		} else {
			outdated = append(outdated, p)
		}
	}
	if len(outdated) > 0 && !holdRollout {
		d.remove = append(d.remove, outdated...)
		d.events = append(d.events, event{reason: "RollingGroup", msg: fmt.Sprintf("group %s: recreating %d pods for its changed template", g.name, len(outdated))})
		outdated = nil
	}
	n := int32(len(current) + len(outdated))
	switch {
	case n < g.desired:
		for range g.desired - n {
			if g.spec == nil {
				d.create = append(d.create, buildHeadPod(ctx, rc, pg))
			} else {
				d.create = append(d.create, buildWorkerPod(ctx, rc, g.spec, pg))
			}
		}
	case n > g.desired && (g.spec == nil || !utils.IsAutoscalingEnabled(&rc.Spec)):
		// Without the autoscaler, scale down by the least useful pods:
		// outdated first, then not ready, then the newest. With it, only
		// workersToDelete removes pods (the autoscaler chose them).
		cands := append(append([]*corev1.Pod(nil), outdated...), byUsefulness(current)...)
		d.remove = append(d.remove, cands[:n-g.desired]...)
	}
	g.pods = current
}

// byUsefulness orders pods not ready first, then newest first.
func byUsefulness(pods []*corev1.Pod) []*corev1.Pod {
	out := append([]*corev1.Pod(nil), pods...)
	sort.SliceStable(out, func(i, j int) bool {
		ri, rj := utils.IsRunningAndReady(out[i]), utils.IsRunningAndReady(out[j])
		if ri != rj {
			return !ri
		}
		return out[i].CreationTimestamp.After(out[j].CreationTimestamp.Time)
	})
	return out
}

// groupSettled: the group has its desired pods, all current and ready.
func groupSettled(g *group) bool {
	if int32(len(g.pods)) != g.desired {
		return false
	}
	for _, p := range g.pods {
		if !utils.IsRunningAndReady(p) {
			return false
		}
	}
	return true
}

func suspend(rc *rayv1.RayCluster, obs observed, d decision) decision {
	st, gen, now := &d.status, rc.Generation, obs.now
	left := 0
	for _, p := range obs.pods {
		if p.DeletionTimestamp == nil {
			d.remove = append(d.remove, p)
		}
		left++
	}
	d.removePodGroup = obs.podGroup != nil
	if left > 0 {
		setCond(st, string(rayv1.RayClusterSuspending), metav1.ConditionTrue, "Suspending", fmt.Sprintf("deleting %d pods", left), gen, now)
		setCond(st, string(rayv1.RayClusterSuspended), metav1.ConditionFalse, "Suspending", fmt.Sprintf("deleting %d pods", left), gen, now)
		setState(st, "", now)
	} else {
		setCond(st, string(rayv1.RayClusterSuspending), metav1.ConditionFalse, "Suspended", "every pod is deleted", gen, now)
		setCond(st, string(rayv1.RayClusterSuspended), metav1.ConditionTrue, "Suspended", "spec.suspend is true: every pod is deleted", gen, now)
		setState(st, rayv1.Suspended, now)
	}
	st.ReadyWorkerReplicas, st.AvailableWorkerReplicas = 0, 0
	st.Head = rayv1.HeadInfo{}
	setCond(st, string(rayv1.HeadPodReady), metav1.ConditionFalse, "Suspended", "the cluster is suspended", gen, now)
	return d
}

// inventoryCondition says, for a group whose single pod no node of this
// cluster can hold (more GPUs per pod than any node, or a product that is
// not there), what is missing.
func inventoryCondition(rc *rayv1.RayCluster, obs observed, d *decision) {
	st, gen, now := &d.status, rc.Generation, obs.now
	var gaps []string
	names := make([]string, 0, len(obs.fits))
	for n := range obs.fits {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if f := obs.fits[n]; f.Verdict == inventory.Never {
			gaps = append(gaps, fmt.Sprintf("group %s: %s", n, f.Message))
		}
	}
	if len(gaps) == 0 {
		if c := meta.FindStatusCondition(st.Conditions, ConditionGPUs); c != nil && c.Status == metav1.ConditionFalse {
			setCond(st, ConditionGPUs, metav1.ConditionTrue, "Fits", "every group's pod fits a node of this cluster", gen, now)
		}
		return
	}
	msg := strings.Join(gaps, "; ")
	if c := meta.FindStatusCondition(st.Conditions, ConditionGPUs); c == nil || c.Status != metav1.ConditionFalse || c.Message != msg {
		d.events = append(d.events, event{warning: true, reason: "NeverFits", msg: msg})
	}
	setCond(st, ConditionGPUs, metav1.ConditionFalse, "NeverFits", msg, gen, now)
}

// status fills in counts, head info, endpoints, conditions and the state.
func status(ctx context.Context, rc *rayv1.RayCluster, obs observed, byGroup map[string][]*corev1.Pod, st *rayv1.RayClusterStatus) {
	gen, now := rc.Generation, obs.now
	st.DesiredWorkerReplicas = utils.CalculateDesiredReplicas(ctx, rc)
	st.MinWorkerReplicas = utils.CalculateMinReplicas(rc)
	st.MaxWorkerReplicas = utils.CalculateMaxReplicas(rc)
	res := desiredResources(ctx, rc)
	st.DesiredCPU, st.DesiredMemory = res[corev1.ResourceCPU], res[corev1.ResourceMemory]
	st.DesiredGPU, st.DesiredTPU = sumGPU(res), res[corev1.ResourceName("google.com/tpu")]

	var ready, available int32
	for name, pods := range byGroup {
		if name == headGroup {
			continue
		}
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning {
				available++
			}
			if utils.IsRunningAndReady(p) {
				ready++
			}
		}
	}
	st.ReadyWorkerReplicas, st.AvailableWorkerReplicas = ready, available

	var head *corev1.Pod
	for _, p := range byGroup[headGroup] {
		if head == nil || utils.IsRunningAndReady(p) {
			head = p
		}
	}
	headReady := head != nil && utils.IsRunningAndReady(head)
	st.Head = rayv1.HeadInfo{}
	if head != nil {
		st.Head.PodName, st.Head.PodIP = head.Name, head.Status.PodIP
	}
	st.Endpoints = nil
	if svc := obs.headService; svc != nil {
		st.Head.ServiceName = svc.Name
		st.Head.ServiceIP = svc.Spec.ClusterIP
		if svc.Spec.ClusterIP == corev1.ClusterIPNone {
			st.Head.ServiceIP = st.Head.PodIP // headless: clients reach the head pod
		}
		for _, p := range svc.Spec.Ports {
			if st.Endpoints == nil {
				st.Endpoints = map[string]string{}
			}
			name := p.Name
			if name == "" {
				name = strconv.Itoa(int(p.Port))
			}
			st.Endpoints[name] = strconv.Itoa(int(p.Port))
		}
	}
	switch {
	case headReady:
		setCond(st, string(rayv1.HeadPodReady), metav1.ConditionTrue, rayv1.HeadPodRunningAndReady, "the head pod is running and ready", gen, now)
	case head == nil:
		setCond(st, string(rayv1.HeadPodReady), metav1.ConditionFalse, rayv1.HeadPodNotFound, "no head pod yet", gen, now)
	default:
		setCond(st, string(rayv1.HeadPodReady), metav1.ConditionFalse, "HeadPodNotReady", fmt.Sprintf("head pod %s is %s and not ready", head.Name, head.Status.Phase), gen, now)
	}
	allReady := headReady && ready == st.DesiredWorkerReplicas
	for _, pods := range byGroup {
		for _, p := range pods {
			allReady = allReady && p.Annotations[AnnotationTemplateHash] != "" // not mid-rollout of a foreign pod
		}
	}
	if allReady {
		if !meta.IsStatusConditionTrue(st.Conditions, string(rayv1.RayClusterProvisioned)) {
			setCond(st, string(rayv1.RayClusterProvisioned), metav1.ConditionTrue, rayv1.AllPodRunningAndReadyFirstTime, "all Ray pods are running and ready", gen, now)
		}
		setState(st, rayv1.Ready, now)
		return
	}
	if !meta.IsStatusConditionTrue(st.Conditions, string(rayv1.RayClusterProvisioned)) {
		setCond(st, string(rayv1.RayClusterProvisioned), metav1.ConditionFalse, rayv1.RayClusterPodsProvisioning,
			fmt.Sprintf("head ready: %v; %d of %d workers ready", headReady, ready, st.DesiredWorkerReplicas), gen, now)
	}
	// Unlike KubeRay, a cluster that loses pods is no longer "ready".
	setState(st, "", now)
}

// setState sets status.state, which KubeRay deprecated for conditions but
// kubectl's STATUS column and Ray tooling still read.
func setState(st *rayv1.RayClusterStatus, s rayv1.ClusterState, now time.Time) {
	if st.State == s {
		return
	}
	st.State = s
	if s == "" {
		return
	}
	if st.StateTransitionTimes == nil {
		st.StateTransitionTimes = map[rayv1.ClusterState]*metav1.Time{}
	}
	st.StateTransitionTimes[s] = ptr.To(metav1.NewTime(now))
}

// sumGPU adds up every GPU-like resource (nvidia.com/gpu, amd.com/gpu, ...).
func sumGPU(res corev1.ResourceList) resource.Quantity {
	var q resource.Quantity
	for name, v := range res {
		if strings.HasSuffix(string(name), "gpu") {
			q.Add(v)
		}
	}
	return q
}

// desiredResources is what the head and the desired (clamped) workers
// request, counting init containers and limits-only resources as the
// scheduler does. KubeRay sums the unclamped replicas.
func desiredResources(ctx context.Context, rc *rayv1.RayCluster) corev1.ResourceList {
	total := gang.PodRequests(&rc.Spec.HeadGroupSpec.Template.Spec)
	for i := range rc.Spec.WorkerGroupSpecs {
		g := &rc.Spec.WorkerGroupSpecs[i]
		n := int64(utils.GetWorkerGroupDesiredReplicas(ctx, *g))
		for name, q := range gang.PodRequests(&g.Template.Spec) {
			sum := total[name]
			sum.Add(*resource.NewMilliQuantity(q.MilliValue()*n, q.Format))
			total[name] = sum
		}
	}
	return total
}
