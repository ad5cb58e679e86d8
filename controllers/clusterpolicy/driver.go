package clusterpolicy

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/driveros"
)

// The driver image is built per OS, as GPU Operator's:
// <version>-<os id><os version> (570.172.08-ubuntu22.04), or precompiled
// for one kernel: <branch>-<kernel>-<os> (570-5.15.0-105-generic-ubuntu22.04).
// A node's OS comes from node feature discovery's os_release labels, else
// (or where it names another OS: NFD lags an OS upgrade) from its
// status.nodeInfo.osImage. One driver DaemonSet per OS (and kernel) among
// the GPU nodes, loom-driver-<target>, placing the nodes Loom labels
// gpu.loom.dev/driver-target=<target>: a node's label, not a list of nodes
// in the DaemonSet, so that a node joining, leaving or changing its OS
// writes that node and no DaemonSet, and one label gives a node one driver
// DaemonSet. A version that names its OS (570.172.08-ubuntu22.04) is used
// as is, by the one DaemonSet loom-driver on every GPU node.

// maxNamed caps the node names a component message lists.
const maxNamed = 5

var (
	nameUnsafeRE = regexp.MustCompile(`[^a-z0-9.-]+`)
	// imageTagRE is what an image reference's tag may be.
	imageTagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// driverGroup is one driver DaemonSet: its target, image tag and the
// names of its nodes.
type driverGroup struct {
	target, tag string
	nodes       []string
}

// driverGroups splits the GPU nodes by OS (and kernel, for precompiled
// drivers) and names those that get no driver, with why. A version with an
// OS suffix is one group for every node.
func driverGroups(cp *gpuv1alpha1.ClusterPolicy, nodes []corev1.Node) (groups []driverGroup, noDriver []string) {
	img, _ := cp.Spec.Driver.EffectiveImage(defaultsFor(gpuv1alpha1.OperandDriver))
	if strings.Contains(img.Version, "-") {
		return []driverGroup{{tag: img.Version}}, nil
	}
	branch, _, _ := strings.Cut(img.Version, ".")
	byTarget := map[string]*driverGroup{}
	for i := range nodes {
		if !meantFor(&nodes[i], cp, gpuv1alpha1.OperandDriver) {
			// Opted out of Loom's driver (one installed on the host, say),
			// or outside the driver's node selector: it wants none, so its
			// OS is no reason to name it.
			continue
		}
		o := driveros.Of(&nodes[i], cp.Spec.Driver.UsePrecompiled)
		if o.Why != "" {
			noDriver = append(noDriver, nodes[i].Name+" ("+o.Why+")")
			continue
		}
		target, tag := o.OS, img.Version+"-"+o.OS
		if cp.Spec.Driver.UsePrecompiled {
			target, tag = o.OS+"-"+o.Kernel, branch+"-"+o.Kernel+"-"+o.OS
		}
		if !imageTagRE.MatchString(tag) {
			noDriver = append(noDriver, fmt.Sprintf("%s (kernel %.80q makes no image tag: %s-<kernel>-%s may hold letters, digits, '_', '.' and '-', at most 128 characters)", nodes[i].Name, o.Kernel, branch, o.OS))
			continue
		}
		g := byTarget[target]
		if g == nil {
			g = &driverGroup{tag: tag}
			byTarget[target] = g
		}
		g.nodes = append(g.nodes, nodes[i].Name)
	}
	groups = nameGroups(byTarget)
	sort.Strings(noDriver)
	return groups, noDriver
}

// driverTargets is the gpu.loom.dev/driver-target label each GPU node is
// to have: its group's target; a node of none (no driver, or the one
// DaemonSet of a version naming its OS) has none.
func driverTargets(groups []driverGroup) map[string]string {
	out := map[string]string{}
	for _, g := range groups {
		for _, n := range g.nodes {
			if g.target != "" {
				out[n] = g.target
			}
		}
	}
	return out
}

// nameGroups names each group's DaemonSet target: its OS (and kernel) made
// dnsSafe, and where two kernels make one name (they differ only in what a
// name cannot hold: case, '+', '_', or past its length), each of those
// with a hash of its own, so that no node is given another kernel's driver.
func nameGroups(byTarget map[string]*driverGroup) []driverGroup {
	named := map[string]int{}
	for raw := range byTarget {
		named[dnsSafe(raw)]++
	}
	groups := make([]driverGroup, 0, len(byTarget))
	for raw, g := range byTarget {
		g.target = dnsSafe(raw)
		if named[g.target] > 1 {
			g.target = strings.Trim(g.target[:min(len(g.target), 41)], "-.") + "-" + apply.Hash(raw)[:8]
		}
		groups = append(groups, *g)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].target < groups[j].target })
	return groups
}

// terms are the node terms of a group: the nodes labelled with its target.
func (g driverGroup) terms() []corev1.NodeSelectorTerm {
	return []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: gpuv1alpha1.LabelDriverTarget, Operator: corev1.NodeSelectorOpIn, Values: []string{g.target}}}}}
}

// driverDaemonSets are the driver's DaemonSets, one per group.
func driverDaemonSets(cp *gpuv1alpha1.ClusterPolicy, namespace string, groups []driverGroup) []*appsv1.DaemonSet {
	op := operandByName(gpuv1alpha1.OperandDriver)
	img, _ := cp.Spec.Driver.EffectiveImage(defaultsFor(gpuv1alpha1.OperandDriver))
	out := make([]*appsv1.DaemonSet, 0, len(groups))
	for _, g := range groups {
		if g.target == "" {
			out = append(out, buildDaemonSet(op, cp, namespace, variant{image: img.Repository + "/" + img.Image + ":" + g.tag}))
			continue
		}
		out = append(out, buildDaemonSet(op, cp, namespace, variant{target: g.target,
			image: img.Repository + "/" + img.Image + ":" + g.tag, restrict: g.terms()}))
	}
	return out
}

// dnsSafe makes a target fit a DaemonSet name (after loom-driver-) and a
// label value: lower case letters, digits, '.' and '-', at most 50
// characters (a hash ends a longer one).
func dnsSafe(s string) string {
	s = strings.Trim(nameUnsafeRE.ReplaceAllString(strings.ToLower(s), "-"), "-.")
	const most = 50
	if len(s) > most {
		s = strings.Trim(s[:most-9], "-.") + "-" + apply.Hash(s)[:8]
	}
	return s
}

// namedList names at most maxNamed items and counts the rest.
func namedList(items []string) string {
	if len(items) > maxNamed {
		return strings.Join(items[:maxNamed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxNamed)
	}
	return strings.Join(items, ", ")
}

func operandByName(name string) operand {
	for _, op := range operands {
		if op.name == name {
			return op
		}
	}
	panic("no operand " + name)
}

// driverReadyMarker is what the driver container writes once its driver
// answers (GPU Operator's name): the validator's driver check, in the
// toolkit's init container, waits for it.
const driverReadyMarker = validationsDir + "/.driver-ctr-ready"

// driverStartup makes the driver container Ready only once its driver
// answers, as GPU Operator's does: a startup probe runs nvidia-smi (for up
// to 20 minutes, a driver being built for the node's kernel) and then
// writes driverReadyMarker; stopping removes it. Without it the pod is
// Ready as soon as its container starts, and a driver upgrade's validation
// passes, and uncordons the node, while the new driver is still building.
func driverStartup(c *corev1.Container) {
	c.StartupProbe = &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c",
			"nvidia-smi && mkdir -p " + validationsDir + " && touch " + driverReadyMarker}}},
		InitialDelaySeconds: 60, PeriodSeconds: 10, TimeoutSeconds: 60, SuccessThreshold: 1, FailureThreshold: 120,
	}
	c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
		Command: []string{"sh", "-c", "rm -f " + driverReadyMarker}}}}
}

// oneDriverPerNode keeps a driver pod off a node while another driver pod
// of Loom's is there, terminating ones included, as GPU Operator's pod
// anti-affinity does: the DaemonSet controller makes a node's new driver
// pod as soon as the old one is deleting (an upgrade's restart) or as
// soon as another OS's DaemonSet places the node (its OS changed), and two
// driver containers would fight over the kernel modules. The scheduler
// holds the new pod Pending until the old one is gone. Outside the
// template hash, like the probe: adding it upgraded no driver.
func oneDriverPerNode(pod *corev1.PodSpec) {
	pod.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
			apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}},
		TopologyKey: corev1.LabelHostname,
	}}}
}

// withDriverManager runs GPU Operator's driver manager before the driver
// container, as GPU Operator does: on a node whose driver is loaded it sets
// the operands' nvidia.com/gpu.deploy.<operand> labels from true to
// paused-for-driver-upgrade and waits for their pods to go (their device
// files hold the driver), unloads the old driver's modules, then sets the
// labels back. Without it a driver pod restarted under a running stack
// fails to unload the driver the device plugin and dcgm-exporter hold.
//
// Whether it evicts the node's GPU pods itself (cordoning the node, and
// uncordoning it when done) and drains it comes from the upgrade policy:
// with autoUpgrade Loom's driver upgrade has evicted and drained before it
// deleted the driver pod, and holds the node cordoned until the new driver
// is validated, so the manager must not (GPU Operator's manager defers to
// its upgrade controller likewise); without it, a person deletes driver
// pods, and the manager evicts the GPU pods and drains by drain's settings.
// Outside the template hash: adding the manager or changing its image,
// env or the upgrade policy restarts no driver.
func withDriverManager(pod *corev1.PodSpec, cp *gpuv1alpha1.ClusterPolicy) {
	m := &cp.Spec.Driver.Manager
	img, ref := m.EffectiveImage()
	up := &cp.Spec.Driver.UpgradePolicy
	drain := gpuv1alpha1.DrainSpec{TimeoutSeconds: 300}
	if up.Drain != nil {
		drain = *up.Drain
	}
	auto := up.AutoUpgradeEnabled()
	env := []corev1.EnvVar{
		{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "OPERATOR_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}, // runc, not the NVIDIA runtime
		{Name: "ENABLE_GPU_POD_EVICTION", Value: strconv.FormatBool(!auto)},
		{Name: "ENABLE_AUTO_DRAIN", Value: strconv.FormatBool(!auto && drain.Enable)},
		{Name: "DRAIN_USE_FORCE", Value: strconv.FormatBool(drain.Force)},
		{Name: "DRAIN_POD_SELECTOR_LABEL", Value: drain.PodSelector},
		{Name: "DRAIN_TIMEOUT_SECONDS", Value: strconv.Itoa(int(drain.TimeoutSeconds)) + "s"},
		{Name: "DRAIN_DELETE_EMPTYDIR_DATA", Value: strconv.FormatBool(drain.DeleteEmptyDir)},
	}
	pod.InitContainers = append([]corev1.Container{{
		Name: "k8s-driver-manager", Image: ref, ImagePullPolicy: img.PullPolicy,
		Command: []string{"driver-manager"}, Args: []string{"uninstall_driver"},
		Env:             withEnv(env, m.Env),
		SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
		VolumeMounts: []corev1.VolumeMount{{Name: "run-nvidia", MountPath: "/run/nvidia", MountPropagation: bidirectional},
			{Name: "host-root", MountPath: "/host", ReadOnly: true, MountPropagation: hostToContainer},
			{Name: "host-sys", MountPath: "/sys"}},
	}}, pod.InitContainers...)
	pod.Volumes = append(pod.Volumes, corev1.Volume{Name: "host-sys", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/sys"}}})
	for _, s := range pullSecrets(img.PullSecrets) {
		if !slices.Contains(pod.ImagePullSecrets, s) {
			pod.ImagePullSecrets = append(pod.ImagePullSecrets, s)
		}
	}
}
