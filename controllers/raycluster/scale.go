package raycluster

import (
	"fmt"
	"sort"
	"strings"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"

	"github.com/loom-dev/loom/internal/podset"
)

// scale makes every group's pods match its desired count and template.
// Pods of groups that no longer exist go. Rollout: the head first (workers
// need its GCS), then the worker groups in spec order; a group's outdated
// pods are recreated only once every group before it is up to date and
// ready, so one group at a time restarts.
func scale(p *pass) bool {
	rc, pg := p.rc, ""
	if p.d.podGroup != nil {
		pg = p.d.podGroup.Name
	}
	head := buildHeadPod(p.ctx, rc, pg)
	groups := []*group{{name: headGroup, path: "spec.headGroupSpec.template", desired: 1, pod: head, stamp: parseStamp(head.Annotations[AnnotationTemplateHash]), pods: p.byGroup[headGroup]}}
	for i := range rc.Spec.WorkerGroupSpecs {
		g := &rc.Spec.WorkerGroupSpecs[i]
		w := buildWorkerPod(p.ctx, rc, g, pg)
		groups = append(groups, &group{name: g.GroupName, path: fmt.Sprintf("spec.workerGroupSpecs[%d].template", i), desired: groupPods(g), pod: w, stamp: parseStamp(w.Annotations[AnnotationTemplateHash]), spec: g, pods: p.byGroup[g.GroupName]})
	}
	known := map[string]bool{}
	for _, g := range groups {
		known[g.name] = true
	}
	for name, pods := range p.byGroup {
		if !known[name] {
			p.d.remove = append(p.d.remove, pods...)
		}
	}
	rolling := false
	for _, g := range groups {
		scaleGroup(p, g, rolling || p.held)
		if !groupSettled(g) {
			rolling = true
		}
	}
	return false
}

func groupOf(p *corev1.Pod) string {
	if p.Labels[utils.RayNodeTypeLabelKey] == string(rayv1.HeadNode) {
		return headGroup
	}
	return p.Labels[utils.RayNodeGroupLabelKey]
}

// scaleGroup makes one group's pods match its desired count and template:
// what it lacks is left to build.
func scaleGroup(p *pass, g *group, holdRollout bool) {
	rc, d := p.rc, &p.d
	live := g.pods
	// workersToDelete: the autoscaler's (or a user's) choice of pods to go.
	if g.spec != nil && len(g.spec.ScaleStrategy.WorkersToDelete) > 0 {
		drop := map[string]bool{}
		for _, n := range g.spec.ScaleStrategy.WorkersToDelete {
			drop[n] = true
		}
		var keep []*corev1.Pod
		for _, pod := range live {
			if drop[pod.Name] {
				d.remove = append(d.remove, pod)
			} else {
				keep = append(keep, pod)
			}
		}
		live = keep
	}
	var current, outdated []*corev1.Pod
	legacy := "" // legacyHash, only for pods of a Loom from before the stamp
	for _, pod := range live {
		if v := pod.Annotations[AnnotationTemplateHash]; legacy == "" && v != "" && !strings.Contains(v, "/") {
			legacy = legacyHash(rc, g.spec)
		}
		if builtFrom(pod.Annotations[AnnotationTemplateHash], g.stamp, legacy) {
			current = append(current, pod)
		} else {
			outdated = append(outdated, pod)
		}
	}
	if len(outdated) > 0 && !holdRollout {
		d.remove = append(d.remove, outdated...)
		p.event(false, "RollingGroup", fmt.Sprintf("group %s: recreating %d pods for its changed template", g.name, len(outdated)))
		outdated = nil
	}
	n := int64(len(current) + len(outdated))
	switch {
	case n < g.desired:
		p.missing = append(p.missing, shortfall{g: g, n: g.desired - n})
	case n > g.desired && (g.spec == nil || !utils.IsAutoscalingEnabled(&rc.Spec)):
		// Without the autoscaler, scale down by the least useful pods:
		// outdated first, then not ready, then the newest. With it, only
		// workersToDelete removes pods (the autoscaler chose them).
		cands := append(append([]*corev1.Pod(nil), outdated...), byUsefulness(current)...)
		d.remove = append(d.remove, cands[:n-g.desired]...)
	}
	g.pods = current
}

// build builds the pods the groups lack, at most what one pass creates
// (the executor's cap, less this pass's deletes), shared by the groups in
// rollout order, and at most buildBytes of pods (by their encoded size:
// a template with thousands of tolerations or env entries makes pods of
// hundreds of kilobytes, which the API server admits); the rest are
// deferred to the next pass, so that what one pass holds in memory grows
// neither with the cluster's size nor with its templates'. A pass builds
// at least one pod. Each group that lacks pods gives one for the preflight
// (without its stamp, whose hash is the cluster's own).
func build(p *pass) bool {
	room := int64(podset.PerPass - min(len(p.d.remove), podset.PerPass))
	bytes := int64(buildBytes)
	for _, s := range p.missing {
		proto := s.g.pod.DeepCopy()
		delete(proto.Annotations, AnnotationTemplateHash)
		p.d.preflight = append(p.d.preflight, prototype{what: "the pods", path: s.g.path, obj: proto})
		size := max(int64(s.g.pod.Size()), 1)
		n := min(s.n, room, bytes/size)
		if n == 0 && len(p.d.create) == 0 && room > 0 {
			n = 1
		}
		for range n {
			p.d.create = append(p.d.create, s.g.pod.DeepCopy())
		}
		room -= n
		bytes = max(bytes-n*size, 0)
		p.d.deferred = add(p.d.deferred, s.n-n)
	}
	return false
}

// buildBytes bounds the encoded size of the pods one pass builds.
const buildBytes = 64 << 20

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
	if int64(len(g.pods)) != g.desired {
		return false
	}
	for _, p := range g.pods {
		if !utils.IsRunningAndReady(p) {
			return false
		}
	}
	return true
}
