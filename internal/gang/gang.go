// Package gang builds Volcano PodGroups and joins pods to them, for every
// reconciler that runs a gang (TrainingJobs, RayClusters). The builders are
// pure; Volcano (volcano.go) tells a controller whether Volcano is installed
// and reads the PodGroup it controls.
package gang

import (
	"maps"
	"slices"

	"gopkg.in/inf.v0"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
)

const (
	// SchedulerName is Volcano's scheduler.
	SchedulerName = "volcano"
	// GroupNameAnnotation joins a pod to its PodGroup; it is the only key
	// the Volcano scheduler reads.
	GroupNameAnnotation = "scheduling.k8s.io/group-name"
	// TaskSpecAnnotation names the pod's task (role), which minTaskMember
	// counts.
	TaskSpecAnnotation = "volcano.sh/task-spec"
	// CRDName is the PodGroup CRD whose presence means Volcano is installed.
	CRDName = "podgroups.scheduling.volcano.sh"
)

// Task is one role of a gang: Count pods built from Spec, of which Min must
// be placed together (0: none of them is required).
type Task struct {
	Name  string
	Count int32
	Min   int32
	Spec  *corev1.PodSpec
}

// Spec is a whole gang.
type Spec struct {
	Name, Namespace   string
	Labels            map[string]string
	Owner             metav1.OwnerReference
	Tasks             []Task
	Queue             string
	PriorityClassName string
}

// MinMember is the number of pods that must be placed together: the sum of
// the tasks' minimums.
func (s *Spec) MinMember() int32 {
	var n int32
	for _, t := range s.Tasks {
		n += t.Min
	}
	return n
}

// PodGroup returns the Volcano PodGroup of the gang: minMember, per-task
// minimums, and minResources as the sum of what the required pods really
// request (every container, init and sidecar containers and the pod overhead
// included, GPUs too), so that Volcano's enqueue check sees the whole need.
func PodGroup(s Spec) *schedulingv1beta1.PodGroup {
	minTask := map[string]int32{}
	total := corev1.ResourceList{}
	for _, t := range s.Tasks {
		if t.Min <= 0 {
			continue
		}
		minTask[t.Name] = t.Min
		add(total, PodRequests(t.Spec), int64(t.Min))
	}
	pg := &schedulingv1beta1.PodGroup{
		TypeMeta: metav1.TypeMeta{APIVersion: schedulingv1beta1.SchemeGroupVersion.String(), Kind: "PodGroup"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            s.Name,
			Namespace:       s.Namespace,
			Labels:          maps.Clone(s.Labels),
			OwnerReferences: []metav1.OwnerReference{s.Owner},
		},
		Spec: schedulingv1beta1.PodGroupSpec{
			MinMember:         s.MinMember(),
			MinTaskMember:     minTask,
			Queue:             s.Queue,
			PriorityClassName: s.PriorityClassName,
		},
	}
	if len(total) > 0 {
		pg.Spec.MinResources = &total
	}
	return pg
}

// Join makes pod a member of the gang's PodGroup as task.
func Join(pod *corev1.Pod, group, task string) {
	pod.Spec.SchedulerName = SchedulerName
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[GroupNameAnnotation] = group
	pod.Annotations[TaskSpecAnnotation] = task
}

// PodRequests returns what a pod built from spec requests: the larger of its
// init containers' peak and the sum of its containers and sidecars, plus
// the overhead. A container that sets only limits requests them, as the API
// server defaults it, so nvidia.com/gpu limits count.
func PodRequests(spec *corev1.PodSpec) corev1.ResourceList {
	if spec == nil {
		return corev1.ResourceList{}
	}
	pod := &corev1.Pod{Spec: *spec}
	pod.Spec.Containers = withDefaultRequests(spec.Containers)
	pod.Spec.InitContainers = withDefaultRequests(spec.InitContainers)
	return resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
}

// withDefaultRequests copies containers, filling missing requests from the
// limits as API defaulting does.
func withDefaultRequests(cs []corev1.Container) []corev1.Container {
	if len(cs) == 0 {
		return cs
	}
	out := slices.Clone(cs)
	for i := range out {
		c := &out[i]
		if len(c.Resources.Limits) == 0 {
			continue
		}
		req := c.Resources.Requests.DeepCopy()
		if req == nil {
			req = corev1.ResourceList{}
		}
		for name, q := range c.Resources.Limits {
			if _, ok := req[name]; !ok {
				req[name] = q.DeepCopy()
			}
		}
		c.Resources.Requests = req
	}
	return out
}

// add adds n times r to total.
func add(total, r corev1.ResourceList, n int64) {
	for name, q := range r {
		if q.IsZero() {
			continue
		}
		d := q.AsDec()
		d.Mul(d, inf.NewDec(n, 0))
		prod := resource.NewDecimalQuantity(*d, q.Format)
		sum := total[name]
		sum.Add(*prod)
		total[name] = sum
	}
}
