package training

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
)

// podView sorts a job's pods for one pass.
type podView struct {
	// current are the pods of the current attempt that are not being
	// deleted and that the gang wants (named for their role and index, the
	// index within the role's replicas), by name.
	current map[string]*corev1.Pod
	// occupied are names held by pods being deleted, of an older attempt or
	// not wanted: a new pod of that name must wait.
	occupied map[string]bool
	// stale are pods of older attempts, or not wanted, not yet being
	// deleted.
	stale []*corev1.Pod
	// leaving are the pods being deleted, by name.
	leaving map[string]*corev1.Pod
	// disrupted is a pod of the current attempt being deleted with the
	// DisruptionTarget condition (the first by name), if any.
	disrupted *corev1.Pod
}

// gone says why pod name of a running gang has left it: being deleted (by
// whom, when its DisruptionTarget condition says: the taint manager on a
// lost node, a preemption, an eviction), or gone.
func gone(pod *corev1.Pod, name string) string {
	if pod == nil {
		return fmt.Sprintf("pod %s disappeared (deleted, or its node was lost)", name)
	}
	if c := disruption(pod); c != nil {
		return fmt.Sprintf("pod %s is being deleted (%s: %s)", name, c.Reason, c.Message)
	}
	return fmt.Sprintf("pod %s is being deleted", name)
}

func viewPods(job *trainingv1alpha1.TrainingJob, pods []*corev1.Pod, attempt int32) podView {
	v := podView{current: make(map[string]*corev1.Pod, len(pods)), occupied: map[string]bool{}, leaving: map[string]*corev1.Pod{}}
	for _, p := range pods {
		role, index, a, ok := podIdentity(p)
		switch {
		case p.DeletionTimestamp != nil:
			v.occupied[p.Name] = true
			v.leaving[p.Name] = p
			if ok && a == attempt && disruption(p) != nil && (v.disrupted == nil || p.Name < v.disrupted.Name) {
				v.disrupted = p
			}
		case !ok || a != attempt || !wanted(job, role, index, p.Name) || v.current[p.Name] != nil:
			v.occupied[p.Name] = true
			v.stale = append(v.stale, p)
		default:
			v.current[p.Name] = p
		}
	}
	return v
}

// countPods fills the per-role counts of the current attempt.
func countPods(st *trainingv1alpha1.TrainingJobStatus, v podView) {
	st.ReplicaStatuses = trainingv1alpha1.ReplicaStatuses{}
	for _, p := range v.current {
		rs := &st.ReplicaStatuses.Master
		if podRole(p) == trainingv1alpha1.RoleWorker {
			rs = &st.ReplicaStatuses.Worker
		}
		switch p.Status.Phase {
		case corev1.PodSucceeded:
			rs.Succeeded++
		case corev1.PodFailed:
			rs.Failed++
		default:
			rs.Active++
		}
	}
}
