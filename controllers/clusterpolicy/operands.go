package clusterpolicy

import (
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
)

// RuntimeClassName is the NVIDIA container runtime's class.
const RuntimeClassName = "nvidia"

const (
	validationsDir         = "/run/nvidia/validations"
	devicePluginConfigDir  = "/etc/nvidia/device-plugin"
	devicePluginConfigKey  = "config.yaml"
	devicePluginConfigName = "loom-device-plugin-config"
	dcgmCountersDir        = "/etc/dcgm-exporter/loom"
)

// operand describes how one operand's pod differs from the common shape.
type operand struct {
	name string
	// privileged operands load kernel modules or touch devices directly.
	privileged bool
	// runtimeClass: runs under the NVIDIA runtime (after the toolkit).
	runtimeClass bool
	hostPaths    []hostPath
	ports        []corev1.ContainerPort
	env          func(cp *gpuv1alpha1.ClusterPolicy) []corev1.EnvVar
	// config returns the operand's configuration whose change must restart
	// its pods (hashed onto the pod template).
	config func(cp *gpuv1alpha1.ClusterPolicy) any
	// onDelete: pods are replaced only when deleted (the driver: upgrades
	// choose the node).
	onDelete bool
	// volumes adds configuration volumes (ConfigMaps) to the pod.
	volumes func(cp *gpuv1alpha1.ClusterPolicy) ([]corev1.Volume, []corev1.VolumeMount)
	// waitFor is the validation marker (under /run/nvidia/validations) an
	// init container waits for before the operand starts on a node.
	waitFor string
	// validates names the component an init container validates (running
	// nvidia-validator) before the operand starts; the validator writes the
	// <component>-ready marker later operands wait for.
	validates string
}

type hostPath struct {
	name, path  string
	propagation *corev1.MountPropagationMode
}

var bidirectional = ptr.To(corev1.MountPropagationBidirectional)

// operands lists the operands in per-node dependency order.
var operands = []operand{
	{
		name: gpuv1alpha1.OperandDriver, privileged: true, onDelete: true,
		hostPaths: []hostPath{{"run-nvidia", "/run/nvidia", bidirectional}, {"host-root", "/", nil}, {"dev", "/dev", nil}},
	},
	{
		name: gpuv1alpha1.OperandToolkit, privileged: true, validates: "driver",
		hostPaths: []hostPath{{"run-nvidia", "/run/nvidia", bidirectional}, {"toolkit-root", "/usr/local/nvidia", nil}, {"containerd-config", "/etc/containerd", nil}},
	},
	{
		name: gpuv1alpha1.OperandValidator, privileged: true, runtimeClass: true,
		hostPaths: []hostPath{{"run-nvidia", "/run/nvidia", bidirectional}},
		env: func(*gpuv1alpha1.ClusterPolicy) []corev1.EnvVar {
			return []corev1.EnvVar{{Name: "COMPONENT", Value: "toolkit"}, {Name: "WITH_WAIT", Value: "true"}}
		},
	},
	{
		name: gpuv1alpha1.OperandDevicePlugin, privileged: true, runtimeClass: true, waitFor: "toolkit-ready",
		hostPaths: []hostPath{{"device-plugin", "/var/lib/kubelet/device-plugins", nil}, {"run-nvidia", "/run/nvidia", nil}},
		env:       devicePluginEnv,
		volumes:   devicePluginVolumes,
		config: func(cp *gpuv1alpha1.ClusterPolicy) any {
			return struct {
				MIG    gpuv1alpha1.MIGStrategy
				Config *gpuv1alpha1.DevicePluginConfig
			}{cp.Spec.MIG.Strategy, cp.Spec.DevicePlugin.Config}
		},
	},
	{
		name: gpuv1alpha1.OperandDCGM, runtimeClass: true, waitFor: "toolkit-ready",
		ports: []corev1.ContainerPort{{Name: "dcgm", ContainerPort: 5555, Protocol: corev1.ProtocolTCP}},
	},
	{
		name: gpuv1alpha1.OperandDCGMExporter, runtimeClass: true, waitFor: "toolkit-ready",
		hostPaths: []hostPath{{"pod-resources", "/var/lib/kubelet/pod-resources", nil}},
		ports:     []corev1.ContainerPort{{Name: "gpu-metrics", ContainerPort: 9400, Protocol: corev1.ProtocolTCP}},
		env: func(*gpuv1alpha1.ClusterPolicy) []corev1.EnvVar {
			return []corev1.EnvVar{{Name: "DCGM_EXPORTER_LISTEN", Value: ":9400"}, {Name: "DCGM_EXPORTER_KUBERNETES", Value: "true"},
				{Name: "DCGM_EXPORTER_COLLECTORS", Value: dcgmCountersDir + "/" + gpuv1alpha1.DCGMCountersKey}}
		},
		volumes: func(cp *gpuv1alpha1.ClusterPolicy) ([]corev1.Volume, []corev1.VolumeMount) {
			return []corev1.Volume{{Name: "counters", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: cp.Spec.DCGMExporter.CountersConfigMap()}}}}},
				[]corev1.VolumeMount{{Name: "counters", MountPath: dcgmCountersDir, ReadOnly: true}}
		},
		// Switching ConfigMaps restarts the exporters (they read the CSV at
		// start).
		config: func(cp *gpuv1alpha1.ClusterPolicy) any { return cp.Spec.DCGMExporter.CountersConfigMap() },
	},
	{
		name: gpuv1alpha1.OperandMIGManager, privileged: true, runtimeClass: true, waitFor: "toolkit-ready",
		hostPaths: []hostPath{{"run-nvidia", "/run/nvidia", nil}, {"host-sys", "/sys", nil}},
		env: func(cp *gpuv1alpha1.ClusterPolicy) []corev1.EnvVar {
			return []corev1.EnvVar{{Name: "DEFAULT_MIG_CONFIG", Value: cp.Spec.MIGManager.DefaultConfig},
				{Name: "CONFIG_FILE", Value: cp.Spec.MIGManager.ConfigMapName}}
		},
		config: func(cp *gpuv1alpha1.ClusterPolicy) any { return cp.Spec.MIGManager },
	},
	{
		name: gpuv1alpha1.OperandNodeStatusExporter, runtimeClass: true, waitFor: "toolkit-ready",
		ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 8000, Protocol: corev1.ProtocolTCP}},
	},
}

func defaultsFor(name string) gpuv1alpha1.OperandDefaults {
	for _, d := range gpuv1alpha1.Defaults {
		if d.Name == name {
			return d.OperandDefaults
		}
	}
	return gpuv1alpha1.OperandDefaults{}
}

// objectName is the name of an operand's DaemonSet and ServiceAccount.
func objectName(op string) string { return gpuv1alpha1.OperandObjectName(op) }

func operandLabels(op string, cp *gpuv1alpha1.ClusterPolicy) map[string]string {
	return map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: op, gpuv1alpha1.LabelPolicy: cp.Name}
}

// BuildDaemonSet is the operand's desired DaemonSet: on GPU nodes only,
// minus nodes that opted out (nvidia.com/gpu.deploy.<operand>=false or
// nvidia.com/gpu.deploy.operands=false). It is a pure function of the policy.
func BuildDaemonSet(op operand, cp *gpuv1alpha1.ClusterPolicy, namespace string) *appsv1.DaemonSet {
	labels := operandLabels(op.name, cp)
	podLabels := map[string]string{}
	for k, v := range cp.Spec.DaemonSets.Labels {
		podLabels[k] = v
	}
	for k, v := range labels {
		podLabels[k] = v
	}
	annotations := map[string]string{}
	for k, v := range cp.Spec.DaemonSets.Annotations {
		annotations[k] = v
	}
	if op.config != nil {
		annotations[gpuv1alpha1.AnnotationConfigHash] = apply.Hash(op.config(cp))
	}
	strategy := appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType}
	if op.onDelete {
		strategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
	}
	template := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: annotations}, Spec: podSpec(op, cp)}
	// Pods carry the hash of the template they were made from: the driver
	// upgrade tells old driver pods from new ones by it.
	annotations[gpuv1alpha1.AnnotationTemplateHash] = apply.Hash(template)
	return &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{Name: objectName(op.name), Namespace: namespace, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: op.name}},
			UpdateStrategy: strategy,
			Template:       template,
		},
	}
}

// podSpec is the operand's pod: its container after the validation init
// container, with its configuration volumes and host paths.
func podSpec(op operand, cp *gpuv1alpha1.ClusterPolicy) corev1.PodSpec {
	spec := cp.Spec.Operand(op.name)
	img, _ := spec.EffectiveImage(defaultsFor(op.name))
	c := container(op, cp)
	var volumes []corev1.Volume
	var initContainers []corev1.Container
	if v, ic := validationInit(op, cp); ic != nil {
		volumes, initContainers = append(volumes, v), append(initContainers, *ic)
	}
	if op.volumes != nil {
		v, m := op.volumes(cp)
		volumes = append(volumes, v...)
		c.VolumeMounts = append(c.VolumeMounts, m...)
	}
	for _, hp := range op.hostPaths {
		volumes = append(volumes, corev1.Volume{Name: hp.name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hp.path}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: hp.name, MountPath: hostMountPath(hp), MountPropagation: hp.propagation})
	}
	pod := corev1.PodSpec{
		ServiceAccountName: objectName(op.name),
		PriorityClassName:  cp.Spec.DaemonSets.PriorityClassName,
		NodeSelector:       spec.NodeSelector,
		Tolerations: append(append([]corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			cp.Spec.DaemonSets.Tolerations...), spec.Tolerations...),
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: gpuv1alpha1.LabelPresent, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}},
					{Key: "nvidia.com/gpu.deploy.operands", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"false"}},
					{Key: "nvidia.com/gpu.deploy." + op.name, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"false"}},
				},
			}}},
		}},
		InitContainers:   initContainers,
		Containers:       []corev1.Container{c},
		Volumes:          volumes,
		HostPID:          op.name == gpuv1alpha1.OperandDriver,
		ImagePullSecrets: pullSecrets(img.PullSecrets),
	}
	if op.runtimeClass {
		pod.RuntimeClassName = ptr.To(RuntimeClassName)
	}
	return pod
}

// container is the operand's own container, before its volume mounts.
func container(op operand, cp *gpuv1alpha1.ClusterPolicy) corev1.Container {
	spec := cp.Spec.Operand(op.name)
	img, ref := spec.EffectiveImage(defaultsFor(op.name))
	c := corev1.Container{
		Name:            op.name,
		Image:           ref,
		ImagePullPolicy: img.PullPolicy,
		Args:            spec.Args,
		Ports:           op.ports,
		SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(op.privileged)},
	}
	if !op.privileged {
		c.SecurityContext.AllowPrivilegeEscalation = ptr.To(false)
		c.SecurityContext.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}})
	if op.runtimeClass {
		c.Env = append(c.Env, corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"})
	}
	if op.env != nil {
		c.Env = append(c.Env, op.env(cp)...)
	}
	c.Env = append(c.Env, spec.Env...)
	if spec.Resources != nil {
		c.Resources = *spec.Resources
	}
	return c
}

// validationInit is the operand's validation init container and the host
// volume of the markers (nil for an operand that neither validates nor
// waits). As GPU Operator does: validation writes a marker per stage on the
// host (/run/nvidia/validations/<stage>-ready); later operands wait for
// theirs, so nothing starts on a node before what it needs.
func validationInit(op operand, cp *gpuv1alpha1.ClusterPolicy) (corev1.Volume, *corev1.Container) {
	if op.waitFor == "" && op.validates == "" {
		return corev1.Volume{}, nil
	}
	validator, validatorRef := cp.Spec.Validator.EffectiveImage(defaultsFor(gpuv1alpha1.OperandValidator))
	v := corev1.Volume{Name: "validations", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: validationsDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}
	ic := &corev1.Container{
		Image: validatorRef, ImagePullPolicy: validator.PullPolicy,
		VolumeMounts: []corev1.VolumeMount{{Name: "validations", MountPath: validationsDir}},
	}
	if op.validates != "" {
		ic.Name = op.validates + "-validation"
		ic.Command = []string{"sh", "-c", "nvidia-validator"}
		ic.Env = []corev1.EnvVar{{Name: "COMPONENT", Value: op.validates}, {Name: "WITH_WAIT", Value: "true"}}
		ic.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		ic.VolumeMounts = append(ic.VolumeMounts, corev1.VolumeMount{Name: "run-nvidia", MountPath: "/run/nvidia", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)})
	} else {
		ic.Name = "wait-for-" + strings.TrimSuffix(op.waitFor, "-ready")
		ic.Command = []string{"sh", "-c", fmt.Sprintf("until [ -f %s/%s ]; do echo waiting for %s; sleep 5; done", validationsDir, op.waitFor, op.waitFor)}
		ic.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}
	}
	return v, ic
}

// DevicePluginConfigMap is the ConfigMap Loom writes for inline
// time-slicing (nil when the policy has none), in the device plugin's own
// config format.
func DevicePluginConfigMap(cp *gpuv1alpha1.ClusterPolicy, namespace string) *corev1.ConfigMap {
	c := cp.Spec.DevicePlugin.Config
	if c == nil || c.TimeSlicing == nil {
		return nil
	}
	type resource struct {
		Name     string `json:"name"`
		Replicas int32  `json:"replicas"`
	}
	resources := make([]resource, len(c.TimeSlicing.Resources))
	for i, r := range c.TimeSlicing.Resources {
		resources[i] = resource{r.Name, r.Replicas}
	}
	cfg := map[string]any{
		"version": "v1",
		"flags":   map[string]any{"migStrategy": string(cp.Spec.MIG.Strategy)},
		"sharing": map[string]any{"timeSlicing": map[string]any{
			"renameByDefault": c.TimeSlicing.RenameByDefault,
			"resources":       resources,
		}},
	}
	b, _ := yaml.Marshal(cfg) // plain data: cannot fail
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: devicePluginConfigName, Namespace: namespace, Labels: operandLabels(gpuv1alpha1.OperandDevicePlugin, cp)},
		Data:       map[string]string{devicePluginConfigKey: string(b)},
	}
}

func devicePluginEnv(cp *gpuv1alpha1.ClusterPolicy) []corev1.EnvVar {
	env := []corev1.EnvVar{{Name: "MIG_STRATEGY", Value: string(cp.Spec.MIG.Strategy)}}
	switch c := cp.Spec.DevicePlugin.Config; {
	case c != nil && c.TimeSlicing != nil:
		env = append(env, corev1.EnvVar{Name: "CONFIG_FILE", Value: devicePluginConfigDir + "/" + devicePluginConfigKey})
	case c != nil && c.ConfigMapName != "":
		env = append(env, corev1.EnvVar{Name: "CONFIG_FILE", Value: devicePluginConfigDir + "/" + c.DefaultConfig})
	}
	return env
}

func devicePluginVolumes(cp *gpuv1alpha1.ClusterPolicy) ([]corev1.Volume, []corev1.VolumeMount) {
	c := cp.Spec.DevicePlugin.Config
	name := ""
	switch {
	case c != nil && c.TimeSlicing != nil:
		name = devicePluginConfigName
	case c != nil && c.ConfigMapName != "":
		name = c.ConfigMapName
	default:
		return nil, nil
	}
	return []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}},
		[]corev1.VolumeMount{{Name: "config", MountPath: devicePluginConfigDir, ReadOnly: true}}
}

func hostMountPath(hp hostPath) string {
	if hp.path == "/" {
		return "/host"
	}
	return hp.path
}

func pullSecrets(names []string) []corev1.LocalObjectReference {
	var out []corev1.LocalObjectReference
	for _, n := range names {
		out = append(out, corev1.LocalObjectReference{Name: n})
	}
	return out
}

// enabledOperands returns the operands the policy runs, in order, and
// those it does not.
func enabledOperands(cp *gpuv1alpha1.ClusterPolicy) (on, off []operand) {
	for _, op := range operands {
		if cp.Spec.Operand(op.name).IsEnabled(defaultsFor(op.name)) {
			on = append(on, op)
		} else {
			off = append(off, op)
		}
	}
	return on, off
}
