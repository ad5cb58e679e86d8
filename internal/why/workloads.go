package why

import (
	"fmt"
	"sort"
	"strings"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

// TrainingJob answers why a job is where it is, from its conditions in the
// order that decides: finished, suspended, not created, not scheduled,
// restarting, waiting for pods, running. names are the GPU resources of the
// cluster's sharing configs (the zero value knows no renames).
func TrainingJob(tj *trainingv1alpha1.TrainingJob, names sharing.Names) Answer {
	a := Answer{Object: "trainingjob/" + tj.Name, Namespace: tj.Namespace, State: string(tj.Status.State)}
	cs := tj.Status.Conditions
	if len(cs) == 0 {
		return noStatus(a, "training")
	}
	order := []struct {
		t    string
		want bool
	}{
		{trainingv1alpha1.ConditionFailed, true},
		{trainingv1alpha1.ConditionSucceeded, true},
		{trainingv1alpha1.ConditionSuspended, true},
		{trainingv1alpha1.ConditionCreated, false},
		{trainingv1alpha1.ConditionScheduled, false},
		{trainingv1alpha1.ConditionRestarting, true},
		{trainingv1alpha1.ConditionRunning, false},
		{trainingv1alpha1.ConditionReady, false},
		{trainingv1alpha1.ConditionRunning, true},
	}
	for _, o := range order {
		if (o.want && isTrue(cs, o.t)) || (!o.want && isFalse(cs, o.t)) {
			c := cond(cs, o.t)
			a.Reason, a.Message = c.Reason, c.Message
			break
		}
	}
	if a.Message == "" {
		c := cs[0]
		a.Reason, a.Message = c.Reason, fmt.Sprintf("%s=%s: %s", c.Type, c.Status, c.Message)
	}
	if a.State == "" {
		a.State = "Unknown"
	}
	a.Advice = trainingAdvice(a.Reason, tj, names)
	if a.Reason == ReasonNotEnoughGPUs && strings.Contains(a.Message, moreThanTheCluster) {
		a.Advice = "the whole job is bigger than the cluster today: add GPU nodes (it starts once they join), or reduce replicas or GPUs per pod"
	}
	a.Also = appendIf(a.Also, stale(tj.Status.ObservedGeneration, tj.Generation))
	return a
}

// moreThanTheCluster is how the inventory's fit says a gang is bigger than
// every eligible GPU in the cluster together ("needs 32 more GPUs than the
// cluster has"): waiting for GPUs to free up would not help.
const moreThanTheCluster = "than the cluster has"

// jobGPUs is the biggest GPU request of one pod of the job (the resource
// and its count) and the GPU product its pods ask for, if any.
func jobGPUs(tj *trainingv1alpha1.TrainingJob, names sharing.Names) (res string, per int64, product string) {
	specs := []*trainingv1alpha1.ReplicaSpec{&tj.Spec.ReplicaSpecs.Master}
	if tj.Spec.ReplicaSpecs.Worker != nil {
		specs = append(specs, tj.Spec.ReplicaSpecs.Worker)
	}
	for _, s := range specs {
		r, n := podGPUs(&s.Template.Spec, names)
		if n > per {
			res, per = r, n
		}
		if p := productOf(&s.Template.Spec); p != "" && product == "" {
			product = p
		}
	}
	return res, per, product
}

// podGPUs is a pod spec's biggest GPU request summed over its containers.
func podGPUs(spec *corev1.PodSpec, names sharing.Names) (string, int64) {
	sums := map[corev1.ResourceName]*resource.Quantity{}
	for _, c := range spec.Containers {
		for name, q := range c.Resources.Requests {
			if !names.IsGPU(string(name)) {
				continue
			}
			if sums[name] == nil {
				sums[name] = resource.NewQuantity(0, resource.DecimalSI)
			}
			sums[name].Add(q)
		}
		for name, q := range c.Resources.Limits {
			if _, ok := c.Resources.Requests[name]; ok || !names.IsGPU(string(name)) {
				continue
			}
			if sums[name] == nil {
				sums[name] = resource.NewQuantity(0, resource.DecimalSI)
			}
			sums[name].Add(q)
		}
	}
	best, n := "", int64(0)
	for name, q := range sums {
		if v := q.Value(); v > n || (v == n && string(name) < best) {
			best, n = string(name), v
		}
	}
	return best, n
}

// productOf is the nvidia.com/gpu.product a pod spec selects, by node
// selector or a required node affinity term.
func productOf(spec *corev1.PodSpec) string {
	if p := spec.NodeSelector[gpuv1alpha1.LabelProduct]; p != "" {
		return p
	}
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil ||
		spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, t := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if e.Key == gpuv1alpha1.LabelProduct && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) > 0 {
				return strings.Join(e.Values, " or ")
			}
		}
	}
	return ""
}

// RayJob answers from the RayJob's status (KubeRay's has no conditions):
// its deployment status, and the reason and message the rayjob reconciler
// set (a verdict of its RayCluster while it waits to submit, KubeRay's
// failure reasons after).
func RayJob(job *rayv1.RayJob) Answer {
	st := job.Status
	a := Answer{Object: "rayjob/" + job.Name, Namespace: job.Namespace, State: string(st.JobDeploymentStatus),
		Reason: string(st.Reason), Message: st.Message}
	if st.JobDeploymentStatus == rayv1.JobDeploymentStatusNew {
		a.State, a.Reason = "Unknown", "NoStatus"
		a.Message = "no status yet: the rayjob reconciler has not written one"
		a.Advice = "check that the Loom manager runs and that its --controllers include rayjob (" + managerLogs + ")"
		return a
	}
	if a.Message == "" {
		a.Message = "Ray job status " + string(st.JobStatus)
		if st.JobStatus == "" {
			a.Message = "not submitted yet"
		}
		if st.RayClusterName != "" {
			a.Message += " on RayCluster " + st.RayClusterName
		}
	}
	a.Advice = rayJobAdvice(a.Reason, job)
	a.Also = appendIf(a.Also, stale(st.ObservedGeneration, job.Generation))
	return a
}

// ClusterPolicy answers from the Ready condition (and its component
// messages) and the driver upgrade's condition.
func ClusterPolicy(cp *gpuv1alpha1.ClusterPolicy) Answer {
	a := Answer{Object: "clusterpolicy/" + cp.Name, State: string(cp.Status.State)}
	cs := cp.Status.Conditions
	ready := cond(cs, "Ready")
	if ready == nil {
		return noStatus(a, "clusterpolicy")
	}
	a.Reason, a.Message = ready.Reason, ready.Message
	up := cond(cs, gpuv1alpha1.ConditionDriverUpgrade)
	if ready.Status == "True" && up != nil && up.Status == "False" {
		a.Reason, a.Message = up.Reason, "driver upgrade: "+up.Message
	} else if up != nil && up.Status == "False" && up.Reason != a.Reason {
		a.Also = append(a.Also, fmt.Sprintf("driver upgrade (%s): %s", up.Reason, OneLine(up.Message)))
	}
	for _, c := range cp.Status.Components {
		if c.Enabled && c.State != "ready" {
			a.Also = append(a.Also, fmt.Sprintf("component %s %s (%d of %d nodes ready): %s", c.Name, c.State, c.Ready, c.Desired, OneLine(c.Message)))
		}
	}
	if m := cp.Status.MIG; m != nil && m.FailureMessage != "" {
		a.Also = append(a.Also, "MIG: "+OneLine(m.FailureMessage))
	}
	a.Advice = policyAdvice(a.Reason, cp)
	a.Also = appendIf(a.Also, stale(cp.Status.ObservedGeneration, cp.Generation))
	return a
}

// Loom's condition types on a RayCluster (the raycluster reconciler's).
const (
	RayConditionGang  = "loom.dev/GangScheduling"
	RayConditionGPUs  = "loom.dev/GPUInventory"
	RayConditionValid = "loom.dev/SpecValid"
)

// RayCluster answers from Loom's and KubeRay's conditions, the most
// blocking first: an invalid spec, a failed apply, GPUs that never fit, the
// gang scheduler, suspension, the head pod, provisioning.
func RayCluster(rc *rayv1.RayCluster) Answer {
	a := Answer{Object: "raycluster/" + rc.Name, Namespace: rc.Namespace, State: string(rc.Status.State)}
	cs := rc.Status.Conditions
	if len(cs) == 0 {
		return noStatus(a, "raycluster")
	}
	order := []struct {
		t    string
		want bool
	}{
		{RayConditionValid, false},
		{string(rayv1.RayClusterReplicaFailure), true},
		{RayConditionGPUs, false},
		{RayConditionGang, false},
		{string(rayv1.RayClusterSuspended), true},
		{string(rayv1.RayClusterSuspending), true},
		{string(rayv1.HeadPodReady), false},
		{string(rayv1.RayClusterProvisioned), false},
		{string(rayv1.RayClusterProvisioned), true},
	}
	for _, o := range order {
		if (o.want && isTrue(cs, o.t)) || (!o.want && isFalse(cs, o.t)) {
			c := cond(cs, o.t)
			a.Reason, a.Message = c.Reason, c.Message
			break
		}
	}
	if a.Message == "" {
		sorted := append(cs[:0:0], cs...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].Type < sorted[j].Type })
		a.Reason, a.Message = sorted[0].Reason, fmt.Sprintf("%s=%s: %s", sorted[0].Type, sorted[0].Status, sorted[0].Message)
	}
	if a.State == "" {
		a.State = "Unknown"
	}
	a.Advice = rayAdvice(a.Reason, rc)
	a.Also = appendIf(a.Also, stale(rc.Status.ObservedGeneration, rc.Generation))
	return a
}
