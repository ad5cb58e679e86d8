package clusterpolicy

import (
	"cmp"
	"slices"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
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
	// The device plugin's config manager (GPU Operator's pattern) copies
	// the config its node's label names from the ConfigMap's directory to
	// the file the plugin reads.
	availableConfigsDir = "/available-configs"
	selectedConfigDir   = "/config"
	// migConfigDir holds the MIG manager's mig-parted config.
	migConfigDir = "/mig-parted-config"
	// migConfigName is Loom's ConfigMap of the built-in MIG layouts.
	migConfigName = "loom-mig-parted-config"
)

// operand describes how one operand's pod differs from the common shape.
type operand struct {
	name string
	// privileged operands load kernel modules or touch devices directly.
	privileged bool
	// runtimeClass: runs under the NVIDIA runtime (after the toolkit).
	runtimeClass bool
	// hostPID: sees (and signals) the host's processes.
	hostPID bool
	// ready is the container's readiness (and liveness) probe: nil, Ready
	// once it runs.
	ready *corev1.Probe
	// command runs the operand's program where its image's entrypoint
	// does not (the validator image's is /bin/bash, which exits at once
	// without a terminal); the policy's args follow it.
	command   []string
	hostPaths []hostPath
	ports     []corev1.ContainerPort
	env       func(cp *gpuv1alpha1.ClusterPolicy) []corev1.EnvVar
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

var (
	bidirectional   = ptr.To(corev1.MountPropagationBidirectional)
	hostToContainer = ptr.To(corev1.MountPropagationHostToContainer)
)

// operands lists the operands in per-node dependency order.
var operands = []operand{
	{
		name: gpuv1alpha1.OperandDriver, privileged: true, onDelete: true, hostPID: true,
		hostPaths: []hostPath{{"run-nvidia", "/run/nvidia", bidirectional}, {"host-root", "/", nil}, {"dev", "/dev", nil}},
		env: func(cp *gpuv1alpha1.ClusterPolicy) []corev1.EnvVar {
			return []corev1.EnvVar{{Name: "KERNEL_MODULE_TYPE", Value: kernelModuleType(cp)}}
		},
	},
	{
		// Installs the NVIDIA runtime and adds it to containerd's config
		// (the installer configures docker unless told), then signals
		// containerd through its socket (hence the host's PIDs), for the
		// driver root its validation found (toolkitScript).
		name: gpuv1alpha1.OperandToolkit, privileged: true, validates: "driver", hostPID: true,
		command: []string{"sh", "-c", toolkitScript, "nvidia-toolkit"},
		hostPaths: []hostPath{{"run-nvidia", "/run/nvidia", bidirectional}, {"toolkit-root", "/usr/local/nvidia", nil}, {"containerd-config", "/etc/containerd", nil},
			{"containerd-socket", "/run/containerd", nil}},
		env: func(*gpuv1alpha1.ClusterPolicy) []corev1.EnvVar {
			return []corev1.EnvVar{{Name: "RUNTIME", Value: "containerd"}, {Name: "CONTAINERD_CONFIG", Value: "/etc/containerd/config.toml"},
				{Name: "CONTAINERD_SOCKET", Value: "/run/containerd/containerd.sock"}}
		},
	},
	{
		// Validates the toolkit (nvidia-smi through the NVIDIA runtime),
		// writes the toolkit-ready marker the later operands wait for, then
		// stays up, as GPU Operator's validator does after its checks.
		name: gpuv1alpha1.OperandValidator, privileged: true, runtimeClass: true,
		command:   []string{"sh", "-c", `nvidia-validator "$@" && echo all validations are successful && exec sleep infinity`, "nvidia-validator"},
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
		// Ready once it serves (GPU Operator's /health probe): a rollout of
		// an exporter that cannot start stops at its first node, and the
		// component does not read ready while none serves.
		ready: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("gpu-metrics"),
			Scheme: corev1.URISchemeHTTP}}, InitialDelaySeconds: 45, PeriodSeconds: 10, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3},
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
				{Name: "CONFIG_FILE", Value: migConfigDir + "/" + gpuv1alpha1.MIGConfigKey}}
		},
		volumes: func(cp *gpuv1alpha1.ClusterPolicy) ([]corev1.Volume, []corev1.VolumeMount) {
			return []corev1.Volume{configMapVolume("mig-parted-config", migConfigMap(cp))},
				[]corev1.VolumeMount{{Name: "mig-parted-config", MountPath: migConfigDir, ReadOnly: true}}
		},
		config: func(cp *gpuv1alpha1.ClusterPolicy) any { return cp.Spec.MIGManager },
	},
	{
		// The validator's metrics component: the validation markers, the
		// driver (nvidia-smi in the host's root, hence privileged, as GPU
		// Operator runs it) and the node's GPU resources as gauges on port
		// 8000.
		name: gpuv1alpha1.OperandNodeStatusExporter, privileged: true, runtimeClass: true, waitFor: "toolkit-ready",
		command:   []string{"nvidia-validator"},
		hostPaths: []hostPath{{"run-nvidia", "/run/nvidia", hostToContainer}, {"host-root", "/", hostToContainer}},
		ports:     []corev1.ContainerPort{{Name: "metrics", ContainerPort: 8000, Protocol: corev1.ProtocolTCP}},
		env: func(*gpuv1alpha1.ClusterPolicy) []corev1.EnvVar {
			return []corev1.EnvVar{{Name: "COMPONENT", Value: "metrics"}, {Name: "METRICS_PORT", Value: "8000"}}
		},
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
	return buildDaemonSet(op, cp, namespace, variant{})
}

// variant is how one of an operand's DaemonSets differs from the plain one:
// the driver's per-OS DaemonSets, a named ConfigMap's content.
type variant struct {
	// target is the driver's OS (and kernel): the DaemonSet is
	// loom-driver-<target>, labelled and selected by it ("" for the plain
	// DaemonSet).
	target string
	// image replaces the operand's image reference.
	image string
	// restrict are alternative node terms the DaemonSet's nodes must also
	// match (nil: every GPU node). Left out of the template hash: a node
	// joining its OS changes no pod.
	restrict []corev1.NodeSelectorTerm
	// configData is the content of the ConfigMaps the operand reads.
	configData any
	// runtime is the containerd the toolkit configures (zero: plain).
	runtime containerRuntime
}

func buildDaemonSet(op operand, cp *gpuv1alpha1.ClusterPolicy, namespace string, v variant) *appsv1.DaemonSet {
	labels := operandLabels(op.name, cp)
	name, selector := objectName(op.name), map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: op.name}
	if v.target != "" {
		labels[gpuv1alpha1.LabelDriverTarget] = v.target
		selector[gpuv1alpha1.LabelDriverTarget] = v.target
		name += "-" + v.target
	}
	podLabels := map[string]string{}
	for k, val := range cp.Spec.DaemonSets.Labels {
		podLabels[k] = val
	}
	for k, val := range labels {
		podLabels[k] = val
	}
	annotations := map[string]string{}
	for k, val := range cp.Spec.DaemonSets.Annotations {
		annotations[k] = val
	}
	switch {
	case op.config != nil && v.configData != nil:
		annotations[gpuv1alpha1.AnnotationConfigHash] = apply.Hash([]any{op.config(cp), v.configData})
	case op.config != nil:
		annotations[gpuv1alpha1.AnnotationConfigHash] = apply.Hash(op.config(cp))
	}
	strategy := appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType}
	if op.onDelete {
		strategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
	}
	spec := podSpec(op, cp)
	if v.image != "" {
		spec.Containers[0].Image = v.image
	}
	if op.name == gpuv1alpha1.OperandToolkit {
		withRuntime(&spec, cp, cmp.Or(v.runtime, containerdPlain))
	}
	template := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: annotations}, Spec: spec}
	// Pods carry the hash of the template they were made from: the driver
	// upgrade tells old driver pods from new ones by it.
	annotations[gpuv1alpha1.AnnotationTemplateHash] = apply.Hash(template)
	// The driver stays off hosts with their own (pre-installed), the other
	// operands off nodes where GPU Operator's driver or MIG manager paused
	// them, which wait for their pods by GPU Operator's app label:
	// placement, outside the hash like the nodes below, so that adding it
	// upgraded no driver.
	optOut(&template.Spec, op.name)
	if app := gpuOperatorApps[op.name]; app != "" {
		template.Labels["app"] = app
	}
	if v.restrict != nil {
		restrictNodes(&template.Spec, v.restrict)
	}
	// Loom's own taint on a node with an unhealthy GPU
	// (health.taintUnhealthyNodes) is tolerated: an operand deleted there
	// (a driver upgrade, a config roll) must come back, and a reinstalled
	// driver is what may heal the node. Placement, like the nodes above:
	// outside the hash, so that adding it upgraded no driver.
	template.Spec.Tolerations = append(template.Spec.Tolerations,
		corev1.Toleration{Key: gpuv1alpha1.TaintUnhealthy, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	if op.name == gpuv1alpha1.OperandDriver {
		// Outside the hash too: adding it upgraded no driver; the pods
		// made from here on (a new node, the next version) have it.
		driverStartup(&template.Spec.Containers[0])
		oneDriverPerNode(&template.Spec)
		withDriverManager(&template.Spec, cp)
	}
	return &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: selector},
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
		volumes, initContainers = append(volumes, v...), append(initContainers, *ic)
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
	if op.validates == gpuv1alpha1.OperandDriver {
		// A driver installed on the host is read where its validation
		// found it (DRIVER_ROOT_CTR_PATH=/host).
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "host-root", MountPath: "/host", ReadOnly: true, MountPropagation: hostToContainer})
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
					{Key: deployLabelPrefix + "operands", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"false"}},
					{Key: deployLabelPrefix + op.name, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"false"}},
				},
			}}},
		}},
		InitContainers:   initContainers,
		Containers:       []corev1.Container{c},
		Volumes:          volumes,
		HostPID:          op.hostPID,
		ImagePullSecrets: pullSecrets(img.PullSecrets),
	}
	if op.runtimeClass {
		pod.RuntimeClassName = ptr.To(RuntimeClassName)
	}
	if op.name == gpuv1alpha1.OperandDevicePlugin {
		withConfigManager(&pod, cp)
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
		Command:         op.command,
		Args:            spec.Args,
		Ports:           op.ports,
		ReadinessProbe:  op.ready,
		LivenessProbe:   op.ready,
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
	c.Env = withEnv(c.Env, spec.Env)
	if spec.Resources != nil {
		c.Resources = *spec.Resources
	}
	return c
}

// withEnv is env with each of set in place of the variable of its name
// (the policy's env overrides the built-in one, as in GPU Operator), the
// others added in order: a container's env is a list keyed by name, and
// the API server refuses an apply that names one twice.
func withEnv(env, set []corev1.EnvVar) []corev1.EnvVar {
	for _, e := range set {
		if i := slices.IndexFunc(env, func(b corev1.EnvVar) bool { return b.Name == e.Name }); i >= 0 {
			env[i] = e
			continue
		}
		env = append(env, e)
	}
	return env
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
		env = append(env, corev1.EnvVar{Name: "CONFIG_FILE", Value: selectedConfigDir + "/" + devicePluginConfigKey})
	}
	return env
}

// devicePluginVolumes mounts the inline time-slicing config, or for a
// ConfigMap of named configs the ConfigMap (every config) and the
// directory of the one selected for the node.
func devicePluginVolumes(cp *gpuv1alpha1.ClusterPolicy) ([]corev1.Volume, []corev1.VolumeMount) {
	switch c := cp.Spec.DevicePlugin.Config; {
	case c != nil && c.TimeSlicing != nil:
		return []corev1.Volume{configMapVolume("config", devicePluginConfigName)},
			[]corev1.VolumeMount{{Name: "config", MountPath: devicePluginConfigDir, ReadOnly: true}}
	case c != nil && c.ConfigMapName != "":
		return []corev1.Volume{configMapVolume("available-configs", c.ConfigMapName),
				{Name: "config", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			[]corev1.VolumeMount{{Name: "available-configs", MountPath: availableConfigsDir, ReadOnly: true},
				{Name: "config", MountPath: selectedConfigDir}}
	}
	return nil, nil
}

// configManager is GPU Operator's config manager for the device plugin's
// ConfigMap of named configs: it follows its node's
// nvidia.com/device-plugin.config label (defaultConfig without it), copies
// that config to the file the plugin reads and signals the plugin to
// reload. oneshot is the init container that writes the first one.
func configManager(cp *gpuv1alpha1.ClusterPolicy, image corev1.Container, oneshot bool) corev1.Container {
	c := cp.Spec.DevicePlugin.Config
	name, signal := "config-manager", "true"
	if oneshot {
		name, signal = "config-manager-init", "false"
	}
	return corev1.Container{
		Name: name, Image: image.Image, ImagePullPolicy: image.ImagePullPolicy,
		Command: []string{"config-manager"},
		Env: []corev1.EnvVar{
			{Name: "ONESHOT", Value: strconv.FormatBool(oneshot)},
			{Name: "KUBECONFIG", Value: ""},
			{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "NODE_LABEL", Value: gpuv1alpha1.LabelDevicePluginConfig},
			{Name: "CONFIG_FILE_SRCDIR", Value: availableConfigsDir},
			{Name: "CONFIG_FILE_DST", Value: selectedConfigDir + "/" + devicePluginConfigKey},
			{Name: "DEFAULT_CONFIG", Value: c.DefaultConfig},
			{Name: "FALLBACK_STRATEGIES", Value: "empty"},
			{Name: "SEND_SIGNAL", Value: signal},
			{Name: "SIGNAL", Value: "1"},
			{Name: "PROCESS_TO_SIGNAL", Value: "nvidia-device-plugin"},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: "available-configs", MountPath: availableConfigsDir, ReadOnly: true},
			{Name: "config", MountPath: selectedConfigDir}},
		SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(false), AllowPrivilegeEscalation: ptr.To(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
	}
}

// withConfigManager adds the config manager to a device plugin pod that
// reads a ConfigMap of named configs; the sidecar signals the plugin, so
// the pod shares one process namespace.
func withConfigManager(pod *corev1.PodSpec, cp *gpuv1alpha1.ClusterPolicy) {
	if c := cp.Spec.DevicePlugin.Config; c == nil || c.ConfigMapName == "" {
		return
	}
	plugin := pod.Containers[0]
	pod.InitContainers = append(pod.InitContainers, configManager(cp, plugin, true))
	pod.Containers = append(pod.Containers, configManager(cp, plugin, false))
	pod.ShareProcessNamespace = ptr.To(true)
}

func configMapVolume(volume, configMap string) corev1.Volume {
	return corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: configMap}}}}
}

// restrictNodes narrows the pod's node affinity to nodes matching one of
// terms as well (each term joined with the shared requirements).
func restrictNodes(pod *corev1.PodSpec, terms []corev1.NodeSelectorTerm) {
	required := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	base := required.NodeSelectorTerms[0].MatchExpressions
	out := make([]corev1.NodeSelectorTerm, len(terms))
	for i, t := range terms {
		out[i] = corev1.NodeSelectorTerm{MatchExpressions: append(slices.Clone(base), t.MatchExpressions...), MatchFields: t.MatchFields}
	}
	required.NodeSelectorTerms = out
}

func kernelModuleType(cp *gpuv1alpha1.ClusterPolicy) string {
	if t := cp.Spec.Driver.KernelModuleType; t != "" {
		return t
	}
	return "auto"
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
