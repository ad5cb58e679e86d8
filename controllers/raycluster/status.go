package raycluster

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/podset"
)

// status fills in counts, head info, endpoints, conditions and the state
// from the live pods.
func status(p *pass) bool {
	st := &p.d.status
	desired(p.rc, st)
	ready := workers(p.byGroup, st)
	headReady := head(p, st)
	allReady := headReady && groupsReady(p)
	for _, pods := range p.byGroup {
		for _, pod := range pods {
			allReady = allReady && pod.Annotations[AnnotationTemplateHash] != "" // not mid-rollout of a foreign pod
		}
	}
	provisioned := meta.IsStatusConditionTrue(st.Conditions, string(rayv1.RayClusterProvisioned))
	if allReady {
		if !provisioned {
			p.set(string(rayv1.RayClusterProvisioned), metav1.ConditionTrue, rayv1.AllPodRunningAndReadyFirstTime, "all Ray pods are running and ready")
		}
		setState(st, rayv1.Ready, p.obs.now)
		return false
	}
	if !provisioned {
		p.set(string(rayv1.RayClusterProvisioned), metav1.ConditionFalse, rayv1.RayClusterPodsProvisioning,
			fmt.Sprintf("head ready: %v; %d of %d workers ready", headReady, ready, st.DesiredWorkerReplicas))
	}
	// Unlike KubeRay, a cluster that loses pods is no longer "ready".
	setState(st, "", p.obs.now)
	return false
}

// desired fills in the replica bounds and the resources the cluster asks
// for.
func desired(rc *rayv1.RayCluster, st *rayv1.RayClusterStatus) {
	st.DesiredWorkerReplicas = clamp32(workerPods(rc, groupPods))
	st.MinWorkerReplicas = clamp32(workerPods(rc, minPods))
	st.MaxWorkerReplicas = clamp32(workerPods(rc, maxPods))
	res := desiredResources(rc)
	st.DesiredCPU, st.DesiredMemory = res[corev1.ResourceCPU], res[corev1.ResourceMemory]
	st.DesiredGPU, st.DesiredTPU = sumGPU(res), res[corev1.ResourceName("google.com/tpu")]
}

// workers counts the running and the ready workers; it returns the ready.
func workers(byGroup map[string][]*corev1.Pod, st *rayv1.RayClusterStatus) int32 {
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
	return ready
}

// groupsReady: every worker group has its desired pods running and ready,
// counted group by group, so that one group's surplus (pods the autoscaler
// has not yet chosen to remove) never stands in for another's missing
// pods, and pods named in workersToDelete, about to go, do not count.
func groupsReady(p *pass) bool {
	for i := range p.rc.Spec.WorkerGroupSpecs {
		g := &p.rc.Spec.WorkerGroupSpecs[i]
		var ready int64
		for _, pod := range p.byGroup[g.GroupName] {
			if utils.IsRunningAndReady(pod) && !slices.Contains(g.ScaleStrategy.WorkersToDelete, pod.Name) {
				ready++
			}
		}
		if ready < groupPods(g) {
			return false
		}
	}
	return true
}

// head fills in the head's pod, Service and endpoints and the HeadPodReady
// condition; it returns whether the head is ready.
func head(p *pass, st *rayv1.RayClusterStatus) bool {
	var pod *corev1.Pod
	for _, h := range p.byGroup[headGroup] {
		if pod == nil || utils.IsRunningAndReady(h) {
			pod = h
		}
	}
	ready := pod != nil && utils.IsRunningAndReady(pod)
	st.Head = rayv1.HeadInfo{}
	if pod != nil {
		st.Head.PodName, st.Head.PodIP = pod.Name, pod.Status.PodIP
	}
	st.Endpoints = nil
	if svc := p.obs.headService; svc != nil {
		st.Head.ServiceName = svc.Name
		st.Head.ServiceIP = svc.Spec.ClusterIP
		if svc.Spec.ClusterIP == corev1.ClusterIPNone {
			st.Head.ServiceIP = st.Head.PodIP // headless: clients reach the head pod
		}
		for _, port := range svc.Spec.Ports {
			if st.Endpoints == nil {
				st.Endpoints = map[string]string{}
			}
			name := port.Name
			if name == "" {
				name = strconv.Itoa(int(port.Port))
			}
			st.Endpoints[name] = strconv.Itoa(int(port.Port))
		}
	}
	switch {
	case ready:
		p.set(string(rayv1.HeadPodReady), metav1.ConditionTrue, rayv1.HeadPodRunningAndReady, "the head pod is running and ready")
	case pod == nil:
		p.set(string(rayv1.HeadPodReady), metav1.ConditionFalse, rayv1.HeadPodNotFound, "no head pod yet")
	default:
		p.set(string(rayv1.HeadPodReady), metav1.ConditionFalse, "HeadPodNotReady", fmt.Sprintf("head pod %s is %s and not ready", pod.Name, pod.Status.Phase))
	}
	return ready
}

// applied records on the status how applying the decision went: a failure
// as ReplicaFailure (KubeRay's condition for it; NameConflict when a name
// the cluster wants is taken by an object it does not control), cleared
// once an apply succeeds. skipped are the optional children left out for
// a name taken: NameConflict too, but the cluster's pods go on, so
// kstatus's conditions stay the pods'.
func applied(st *rayv1.RayClusterStatus, err, skipped error, gen int64, now time.Time) {
	failure := string(rayv1.RayClusterReplicaFailure)
	if err == nil && skipped != nil {
		setCond(st, failure, metav1.ConditionTrue, ReasonNameConflict, podset.Message(skipped), gen, now)
		return
	}
	if err != nil {
		reason := "FailedToApply"
		if nameConflict(err) {
			reason = ReasonNameConflict
		}
		setCond(st, failure, metav1.ConditionTrue, reason, podset.Message(err), gen, now)
		// A failed apply is retried; a name taken waits for a person.
		conflict := reason == ReasonNameConflict
		setKstatus(st, false, !conflict, conflict, reason, podset.Message(err), gen, now)
	} else if meta.IsStatusConditionTrue(st.Conditions, failure) {
		setCond(st, failure, metav1.ConditionFalse, "Applied", "every pod and Service was created or deleted as needed", gen, now)
	}
}

// countsOnly: the new status differs from the old only in counts and
// condition messages.
func countsOnly(old, st *rayv1.RayClusterStatus) bool {
	return old.State == st.State && old.ObservedGeneration == st.ObservedGeneration && old.Head == st.Head &&
		apply.SameConditions(old.Conditions, st.Conditions)
}

// progressOnly: the new status only records progress towards a cluster
// not yet ready (its pods being created, scheduled, started), and so did
// the old one, if any: kstatus's Reconciling, nothing stalled, failed,
// suspended or held by a verdict (the spec, the inventory, the gang). Such
// a write may wait a moment, so that a cluster whose pods come up quickly
// is written once, ready. A status that clears a verdict (a resume, a
// conflict resolved) is news and is written at once. A status only
// another writer has touched (the monitoring controller's
// loom.dev/Monitoring, which often lands first on a new cluster) counts as
// not yet written: that condition says nothing of the pods.
func progressOnly(old, st *rayv1.RayClusterStatus) bool {
	return old.State != rayv1.Ready && provisioning(st) && (!hasOwnCondition(old) || provisioning(old))
}

// hasOwnCondition: st carries a condition of this controller's.
func hasOwnCondition(st *rayv1.RayClusterStatus) bool {
	for _, c := range st.Conditions {
		if slices.Contains(conditions, c.Type) {
			return true
		}
	}
	return false
}

// provisioning: st says the cluster's pods are on their way and nothing
// stands in the way.
func provisioning(st *rayv1.RayClusterStatus) bool {
	if st.State != "" || !meta.IsStatusConditionTrue(st.Conditions, ConditionReconciling) {
		return false
	}
	for _, t := range []string{ConditionStalled, string(rayv1.RayClusterReplicaFailure), string(rayv1.RayClusterSuspending), string(rayv1.RayClusterSuspended)} {
		if meta.IsStatusConditionTrue(st.Conditions, t) {
			return false
		}
	}
	for _, t := range []string{ConditionGPUs, ConditionGang, ConditionValid} {
		if meta.IsStatusConditionFalse(st.Conditions, t) {
			return false
		}
	}
	return true
}

// touched stamps st.LastUpdateTime when st says anything old does not (as
// KubeRay does, which compares the statuses but for that time), and keeps
// old's time otherwise.
func touched(old, st *rayv1.RayClusterStatus, now time.Time) {
	st.LastUpdateTime = old.LastUpdateTime
	if !equality.Semantic.DeepEqual(old, st) {
		st.LastUpdateTime = ptr.To(metav1.NewTime(now))
	}
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

// nameConflict: err is (or wraps) a name taken by an object the cluster
// does not control: a pod (podset.ConflictError; an earlier attempt's pod
// is the cluster's own and goes by itself) or a child (apply.ForeignError).
func nameConflict(err error) bool {
	var c *podset.ConflictError
	return errors.As(err, &c) && c.Stranger() || apply.IsForeign(err)
}

// desiredResources is what the head and the desired (clamped) workers
// request, counting init containers and limits-only resources as the
// scheduler does. KubeRay sums the unclamped replicas.
func desiredResources(rc *rayv1.RayCluster) corev1.ResourceList {
	total := gang.PodRequests(&rc.Spec.HeadGroupSpec.Template.Spec)
	for i := range rc.Spec.WorkerGroupSpecs {
		g := &rc.Spec.WorkerGroupSpecs[i]
		n := groupPods(g)
		for name, q := range gang.PodRequests(&g.Template.Spec) {
			sum := total[name]
			sum.Add(times(q, n))
			total[name] = sum
		}
	}
	return total
}

// times is q × n, exactly and without overflow (Quantity has no
// multiplication; n is added in by doubling).
func times(q resource.Quantity, n int64) resource.Quantity {
	out := resource.Quantity{Format: q.Format}
	for acc := q.DeepCopy(); n > 0; n >>= 1 {
		if n&1 == 1 {
			out.Add(acc)
		}
		acc.Add(acc.DeepCopy())
	}
	return out
}

// settle sets Ready and kstatus's Reconciling and Stalled once the phases
// have decided: kstatus reads a cluster whose pods all run, ready and up
// to date, Current; one provisioning, scaling, rolling out or suspending
// InProgress; one held on its spec or on a missing Volcano Failed. A
// suspended cluster has what it asked for: Ready False, nothing to do.
func settle(p *pass) {
	st := &p.d.status
	work := len(p.d.create) > 0 || len(p.d.remove) > 0 || p.d.deferred > 0 || p.d.removePodGroup && p.obs.podGroup != nil
	gangCond := meta.FindStatusCondition(st.Conditions, ConditionGang)
	var ready, reconciling, stalled bool
	reason, msg := string(rayv1.RayClusterPodsProvisioning), "waiting for the cluster's pods"
	switch valid := meta.FindStatusCondition(st.Conditions, ConditionValid); {
	case valid != nil && valid.Status == metav1.ConditionFalse:
		stalled, reason, msg = true, valid.Reason, valid.Message
	case gangCond != nil && gangCond.Reason == "VolcanoNotInstalled" && !p.gangOff:
		stalled, reason, msg = true, gangCond.Reason, gangCond.Message
	case meta.IsStatusConditionTrue(st.Conditions, string(rayv1.RayClusterSuspended)):
		reason, msg = string(rayv1.RayClusterSuspended), "spec.suspend is true: every pod is deleted"
	case meta.IsStatusConditionTrue(st.Conditions, string(rayv1.RayClusterSuspending)):
		reconciling, reason, msg = true, "Suspending", "deleting the cluster's pods"
	case st.State == rayv1.Ready:
		ready, reconciling = true, work
		reason, msg = rayv1.AllPodRunningAndReadyFirstTime, "all Ray pods are running and ready"
		if work {
			msg = "all Ray pods are running and ready; replacing or removing some"
		}
	default:
		reconciling = true
		for _, t := range []rayv1.RayClusterConditionType{rayv1.HeadPodReady, rayv1.RayClusterProvisioned} {
			if c := meta.FindStatusCondition(st.Conditions, string(t)); c != nil && c.Status == metav1.ConditionFalse {
				reason, msg = c.Reason, c.Message
			}
		}
		if gangCond != nil && gangCond.Status == metav1.ConditionFalse && !p.gangOff {
			reason, msg = gangCond.Reason, gangCond.Message
		}
	}
	setKstatus(st, ready, reconciling, stalled, reason, msg, p.rc.Generation, p.obs.now)
}

// setKstatus writes Ready, Reconciling and Stalled: reason and msg go on
// the one that says what stands (Ready when it is True).
func setKstatus(st *rayv1.RayClusterStatus, ready, reconciling, stalled bool, reason, msg string, gen int64, now time.Time) {
	b := func(v bool) metav1.ConditionStatus {
		if v {
			return metav1.ConditionTrue
		}
		return metav1.ConditionFalse
	}
	say := func(v bool, otherwise string) string {
		if v {
			return msg
		}
		return otherwise
	}
	setCond(st, ConditionReady, b(ready), reason, msg, gen, now)
	setCond(st, ConditionReconciling, b(reconciling), reason, say(reconciling, "nothing left to do"), gen, now)
	setCond(st, ConditionStalled, b(stalled), reason, say(stalled, "nothing in the way"), gen, now)
}
