package training

import (
	"maps"
	"math"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
)

// Labels on every pod (and the Service and PodGroup) of a job; the shape of
// Kubeflow's training.kubeflow.org/* labels under Loom's prefix.
const (
	LabelJobName      = trainingv1alpha1.LabelJobName
	LabelReplicaType  = trainingv1alpha1.LabelReplicaType
	LabelReplicaIndex = trainingv1alpha1.LabelReplicaIndex
	LabelJobRole      = trainingv1alpha1.LabelJobRole
	LabelAttempt      = trainingv1alpha1.LabelAttempt
)

// roles lists the roles in rank order.
var roles = []trainingv1alpha1.Role{trainingv1alpha1.RoleMaster, trainingv1alpha1.RoleWorker}

// PodName is <job>-<role>-<index>, also the pod's hostname.
func PodName(job string, role trainingv1alpha1.Role, index int32) string {
	return job + "-" + string(role) + "-" + strconv.FormatInt(int64(index), 10)
}

// isPodName: name is PodName(job, role, index), told without building it
// (a pass over a gang of 512 pods asks it of every pod).
func isPodName(name, job string, role trainingv1alpha1.Role, index int32) bool {
	rest, ok := strings.CutPrefix(name, job)
	if !ok {
		return false
	}
	if rest, ok = strings.CutPrefix(rest, "-"); !ok {
		return false
	}
	if rest, ok = strings.CutPrefix(rest, string(role)); !ok {
		return false
	}
	if rest, ok = strings.CutPrefix(rest, "-"); !ok {
		return false
	}
	var buf [12]byte
	return rest == string(strconv.AppendInt(buf[:0], int64(index), 10))
}

// podRole is the role label of a pod podIdentity has accepted.
func podRole(p *corev1.Pod) trainingv1alpha1.Role {
	return trainingv1alpha1.Role(p.Labels[LabelReplicaType])
}

func replicaSpec(job *trainingv1alpha1.TrainingJob, role trainingv1alpha1.Role) *trainingv1alpha1.ReplicaSpec {
	if role == trainingv1alpha1.RoleMaster {
		return &job.Spec.ReplicaSpecs.Master
	}
	return job.Spec.ReplicaSpecs.Worker
}

// replicas is the role's pod count (the master is always one).
func replicas(job *trainingv1alpha1.TrainingJob, role trainingv1alpha1.Role) int32 {
	if role == trainingv1alpha1.RoleMaster {
		return 1
	}
	return job.Spec.Workers()
}

// scheduler is the job's gang scheduler: its spec's, else the manager's,
// where the manager's auto is Volcano when its CRDs are served and none
// otherwise. auto says whether auto chose it.
func scheduler(job *trainingv1alpha1.TrainingJob, def trainingv1alpha1.GangScheduler, volcano bool) (s trainingv1alpha1.GangScheduler, auto bool) {
	switch {
	case job.Spec.Gang.Scheduler != "":
		return job.Spec.Gang.Scheduler, false
	case def != manager.GangAuto:
		return def, false
	case volcano:
		return trainingv1alpha1.GangVolcano, true
	}
	return trainingv1alpha1.GangNone, true
}

func jobLabels(job *trainingv1alpha1.TrainingJob) map[string]string {
	return map[string]string{LabelJobName: job.Name, apply.LabelManagedBy: apply.ManagedBy}
}

func ownerRef(job *trainingv1alpha1.TrainingJob) metav1.OwnerReference {
	return *metav1.NewControllerRef(job, trainingv1alpha1.GroupVersion.WithKind("TrainingJob"))
}

// buildPod is the pod <job>-<role>-<index> of an attempt: the role's template
// plus identity (labels, hostname under the job's Service), the framework's
// environment and ports, restartPolicy Never (Loom restarts the gang, not
// containers), and, with Volcano, the gang membership. Variables the user set
// in the template win over Loom's.
func buildPod(job *trainingv1alpha1.TrainingJob, fw framework, role trainingv1alpha1.Role, index, attempt int32, sched trainingv1alpha1.GangScheduler) *corev1.Pod {
	rs := replicaSpec(job, role)
	tmpl := rs.Template.DeepCopy()
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            PodName(job.Name, role, index),
			Namespace:       job.Namespace,
			Labels:          maps.Clone(tmpl.Labels),
			Annotations:     maps.Clone(tmpl.Annotations),
			OwnerReferences: []metav1.OwnerReference{ownerRef(job)},
		},
		Spec: tmpl.Spec,
	}
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	maps.Copy(pod.Labels, jobLabels(job))
	pod.Labels[LabelReplicaType] = string(role)
	pod.Labels[LabelReplicaIndex] = strconv.Itoa(int(index))
	pod.Labels[LabelAttempt] = strconv.Itoa(int(attempt))
	if role == trainingv1alpha1.RoleMaster {
		pod.Labels[LabelJobRole] = "master"
	}
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.Hostname = pod.Name
	pod.Spec.Subdomain = job.Name
	if job.Spec.Gang.PriorityClassName != "" && pod.Spec.PriorityClassName == "" {
		pod.Spec.PriorityClassName = job.Spec.Gang.PriorityClassName
	}

	env := fw.Env(job, role, index)
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		c.Env = mergeEnv(c.Env, env)
	}
	if ports := fw.Ports(job, role); len(ports) > 0 && len(pod.Spec.Containers) > 0 {
		for _, p := range ports {
			if !hasPort(pod.Spec.Containers, p.Name) {
				pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, p)
			}
		}
	}
	if sched == trainingv1alpha1.GangVolcano {
		gang.Join(pod, job.Name, string(role))
	}
	return pod
}

// mergeEnv appends Loom's variables after the user's, skipping names the
// user set.
func mergeEnv(user, loom []corev1.EnvVar) []corev1.EnvVar {
	set := make(map[string]bool, len(user))
	for _, e := range user {
		set[e.Name] = true
	}
	out := append([]corev1.EnvVar(nil), user...)
	for _, e := range loom {
		if !set[e.Name] {
			out = append(out, e)
		}
	}
	return out
}

func hasPort(cs []corev1.Container, name string) bool {
	for _, c := range cs {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// buildService is the job's headless Service: it gives every pod the DNS
// name <pod>.<job> (before the pods are ready: rendezvous needs the names
// first). One Service for the gang, not one per pod as Kubeflow does. The
// writer adds the owner reference.
func buildService(job *trainingv1alpha1.TrainingJob, fw framework) *corev1.Service {
	var ports []corev1.ServicePort
	for _, p := range fw.Ports(job, trainingv1alpha1.RoleMaster) {
		ports = append(ports, corev1.ServicePort{Name: p.Name, Port: p.ContainerPort, TargetPort: intstr.FromInt32(p.ContainerPort), Protocol: corev1.ProtocolTCP})
	}
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name: job.Name, Namespace: job.Namespace,
			Labels: jobLabels(job),
		},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 map[string]string{LabelJobName: job.Name},
			PublishNotReadyAddresses: true,
			Ports:                    ports,
		},
	}
}

// gangSpec describes the job's gang: the master first, then as many workers
// as minAvailable asks for.
func gangSpec(job *trainingv1alpha1.TrainingJob) gang.Spec {
	s := gang.Spec{
		Name: job.Name, Namespace: job.Namespace,
		Labels:            jobLabels(job),
		Owner:             ownerRef(job),
		Queue:             job.Spec.Queue(),
		PriorityClassName: job.Spec.Gang.PriorityClassName,
	}
	need := job.Spec.MinAvailable()
	for _, role := range roles {
		rs := replicaSpec(job, role)
		n := replicas(job, role)
		if rs == nil || n == 0 {
			continue
		}
		m := min(n, need)
		need -= m
		s.Tasks = append(s.Tasks, gang.Task{Name: string(role), Count: n, Min: m, Spec: &rs.Template.Spec})
	}
	return s
}

// buildPodGroup is the gang's PodGroup for an attempt. The attempt label
// tells a PodGroup left from an earlier attempt (whose Volcano phase still
// says Running) from the current one.
func buildPodGroup(job *trainingv1alpha1.TrainingJob, attempt int32) *schedulingv1beta1.PodGroup {
	pg := gang.PodGroup(gangSpec(job))
	pg.Labels[LabelAttempt] = strconv.Itoa(int(attempt))
	return pg
}

// gangGPUs is the job's whole nvidia.com/gpu request and its shape (every
// GPU resource) for the inventory.
func gangGPUs(job *trainingv1alpha1.TrainingJob) (int64, inventory.Gang) {
	var total int64
	var g inventory.Gang
	for _, role := range roles {
		rs := replicaSpec(job, role)
		n := replicas(job, role)
		if rs == nil || n == 0 {
			continue
		}
		per := max(inventory.PodGPUs(&rs.Template.Spec), 0)
		total = satAdd(total, satMul(per, int64(n)))
		// Every GPU resource (MIG devices, shared replicas too), with
		// the template's node selector, affinity and tolerations.
		g.Groups = append(g.Groups, inventory.PodGroups(int64(n), &rs.Template.Spec)...)
	}
	return total, g
}

// satMul and satAdd are a*b and a+b of non-negative numbers, saturated at
// math.MaxInt64: a hostile GPU count cannot wrap the status's total.
func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// podIdentity parses a pod's role, index and attempt from its labels.
func podIdentity(p *corev1.Pod) (role trainingv1alpha1.Role, index, attempt int32, ok bool) {
	role = trainingv1alpha1.Role(p.Labels[LabelReplicaType])
	if role != trainingv1alpha1.RoleMaster && role != trainingv1alpha1.RoleWorker {
		return "", 0, 0, false
	}
	i, err1 := strconv.ParseInt(p.Labels[LabelReplicaIndex], 10, 32)
	a, err2 := strconv.ParseInt(p.Labels[LabelAttempt], 10, 32)
	if err1 != nil || err2 != nil || !strings.HasPrefix(p.Name, p.Labels[LabelJobName]+"-") {
		return "", 0, 0, false
	}
	return role, int32(i), int32(a), true
}
