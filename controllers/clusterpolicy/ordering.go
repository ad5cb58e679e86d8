// Per-node ordering: the validation init containers that hold an operand
// until what it needs works on its node, and the toolkit's start for the
// driver root its validation found.

package clusterpolicy

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// toolkitScript starts the toolkit's installer for the node's driver root
// (NVIDIA_DRIVER_ROOT, and DRIVER_ROOT_CTR_PATH where the container reads
// it), as GPU Operator's toolkit entrypoint does: Loom's driver
// container's, /run/nvidia/driver, unless the driver validation found a
// driver installed on the host (/, read at /host), which it says in the
// driver-ready marker it writes (older validators: host-driver-ready).
// The policy's toolkit args go to the installer.
const toolkitScript = `NVIDIA_DRIVER_ROOT=/run/nvidia/driver DRIVER_ROOT_CTR_PATH=/run/nvidia/driver
if [ -f ` + validationsDir + `/host-driver-ready ]; then NVIDIA_DRIVER_ROOT=/ DRIVER_ROOT_CTR_PATH=/host; fi
set -a
. ` + validationsDir + `/driver-ready
set +a
export NVIDIA_DRIVER_ROOT DRIVER_ROOT_CTR_PATH
exec nvidia-toolkit "$@" /usr/local/nvidia`

// validationInit is the operand's validation init container and its host
// volumes (nil for an operand that neither validates nor waits). As GPU
// Operator does: validation writes a marker per stage on the host
// (/run/nvidia/validations/<stage>-ready); later operands wait for theirs,
// so nothing starts on a node before what it needs. The driver's
// validation looks for a driver installed on the host in the host's root
// at /host (nvidia-smi there), else for a driver container's under
// /run/nvidia/driver, and links the NVIDIA devices in /dev/char.
func validationInit(op operand, cp *gpuv1alpha1.ClusterPolicy) ([]corev1.Volume, *corev1.Container) {
	if op.waitFor == "" && op.validates == "" {
		return nil, nil
	}
	validator, validatorRef := cp.Spec.Validator.EffectiveImage(defaultsFor(gpuv1alpha1.OperandValidator))
	v := []corev1.Volume{{Name: "validations", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: validationsDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}}
	ic := &corev1.Container{
		Image: validatorRef, ImagePullPolicy: validator.PullPolicy,
		VolumeMounts: []corev1.VolumeMount{{Name: "validations", MountPath: validationsDir}},
	}
	if op.validates != "" {
		ic.Name = op.validates + "-validation"
		ic.Command = []string{"sh", "-c", "nvidia-validator"}
		ic.Env = []corev1.EnvVar{{Name: "COMPONENT", Value: op.validates}, {Name: "WITH_WAIT", Value: "true"}}
		ic.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		ic.VolumeMounts = append(ic.VolumeMounts, corev1.VolumeMount{Name: "run-nvidia", MountPath: "/run/nvidia", MountPropagation: hostToContainer},
			corev1.VolumeMount{Name: "host-root", MountPath: "/host", ReadOnly: true, MountPropagation: hostToContainer},
			corev1.VolumeMount{Name: "host-dev-char", MountPath: "/host-dev-char"})
		v = append(v, corev1.Volume{Name: "host-root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}},
			corev1.Volume{Name: "host-dev-char", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev/char"}}})
	} else {
		ic.Name = "wait-for-" + strings.TrimSuffix(op.waitFor, "-ready")
		ic.Command = []string{"sh", "-c", fmt.Sprintf("until [ -f %s/%s ]; do echo waiting for %s; sleep 5; done", validationsDir, op.waitFor, op.waitFor)}
		ic.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}
	}
	return v, ic
}
