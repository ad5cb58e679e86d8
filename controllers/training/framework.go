package training

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
)

// A framework decides what the pods of a job need to find each other: the
// rendezvous environment and the ports. Adding MPI or JAX is one more
// implementation; the reconciler does not change.
type framework interface {
	// Env is the environment of every container of one pod.
	Env(job *trainingv1alpha1.TrainingJob, role trainingv1alpha1.Role, index int32) []corev1.EnvVar
	// Ports are the container ports a pod of the role must expose (added to
	// its first container unless a container declares them by name).
	Ports(job *trainingv1alpha1.TrainingJob, role trainingv1alpha1.Role) []corev1.ContainerPort
}

var frameworks = map[trainingv1alpha1.Framework]framework{
	trainingv1alpha1.FrameworkPyTorch: pytorch{},
	"":                                pytorch{},
}

// pytorch is torch.distributed with torchrun: the Kubeflow PyTorchJob
// environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK) and torchrun's
// PET_* set.
type pytorch struct{}

// PortName is the master's rendezvous port name, as Kubeflow names it.
const PortName = "pytorchjob-port"

func (pytorch) Ports(job *trainingv1alpha1.TrainingJob, role trainingv1alpha1.Role) []corev1.ContainerPort {
	if role != trainingv1alpha1.RoleMaster {
		return nil
	}
	return []corev1.ContainerPort{{Name: PortName, ContainerPort: job.Spec.MasterPort(), Protocol: corev1.ProtocolTCP}}
}

func (pytorch) Env(job *trainingv1alpha1.TrainingJob, role trainingv1alpha1.Role, index int32) []corev1.EnvVar {
	nodes := job.Spec.Pods()
	rank := index
	if role == trainingv1alpha1.RoleWorker {
		rank = index + 1
	}
	nproc := nprocPerNode(job, role)
	world := worldSize(job)
	addr := MasterAddr(job)
	port := strconv.Itoa(int(job.Spec.MasterPort()))
	return []corev1.EnvVar{
		{Name: "MASTER_ADDR", Value: addr},
		{Name: "MASTER_PORT", Value: port},
		{Name: "WORLD_SIZE", Value: world},
		{Name: "RANK", Value: strconv.Itoa(int(rank))},
		{Name: "PYTHONUNBUFFERED", Value: "1"},
		{Name: "PET_MASTER_ADDR", Value: addr},
		{Name: "PET_MASTER_PORT", Value: port},
		{Name: "PET_NNODES", Value: strconv.Itoa(int(nodes))},
		{Name: "PET_NODE_RANK", Value: strconv.Itoa(int(rank))},
		{Name: "PET_NPROC_PER_NODE", Value: nproc},
	}
}

// worldSize is WORLD_SIZE, the same in every pod of the gang, as ranks
// must agree on it: the processes of all pods (each role's nprocPerNode
// times its pods, so a 1-GPU master beside 8-GPU workers counts 1 + 8 per
// worker), or the number of pods when a role's nprocPerNode is not a
// number ("auto": torchrun decides, and sets its own WORLD_SIZE).
func worldSize(job *trainingv1alpha1.TrainingJob) string {
	var procs int64
	for _, role := range []trainingv1alpha1.Role{trainingv1alpha1.RoleMaster, trainingv1alpha1.RoleWorker} {
		pods := int64(replicas(job, role))
		if pods == 0 {
			continue
		}
		n, err := strconv.ParseInt(nprocPerNode(job, role), 10, 64)
		if err != nil {
			return strconv.Itoa(int(job.Spec.Pods()))
		}
		procs += pods * n
	}
	return strconv.FormatInt(procs, 10)
}

// MasterAddr is the master's DNS name within the namespace:
// <job>-master-0.<job>, the pod's hostname under the job's headless Service.
func MasterAddr(job *trainingv1alpha1.TrainingJob) string {
	return fmt.Sprintf("%s.%s", PodName(job.Name, trainingv1alpha1.RoleMaster, 0), job.Name)
}

// nprocPerNode is spec.pytorch.nprocPerNode, or the GPUs a pod of the role
// requests, or "auto".
func nprocPerNode(job *trainingv1alpha1.TrainingJob, role trainingv1alpha1.Role) string {
	if job.Spec.PyTorch != nil && job.Spec.PyTorch.NprocPerNode != "" {
		return job.Spec.PyTorch.NprocPerNode
	}
	if rs := replicaSpec(job, role); rs != nil {
		if g := inventory.PodGPUs(&rs.Template.Spec); g > 0 {
			return strconv.FormatInt(g, 10)
		}
	}
	return "auto"
}
