package clusterpolicy

import (
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// containerRuntime is the containerd the toolkit adds the NVIDIA runtime
// to: its config file (a k3s or RKE2 containerd's is the template its
// agent renders the config from) and its socket, which GPU Operator has
// users set in the toolkit's env for k3s and RKE2.
type containerRuntime struct {
	name, config, socket string
}

var (
	containerdPlain = containerRuntime{"containerd", "/etc/containerd/config.toml", "/run/containerd/containerd.sock"}
	containerdK3s   = containerRuntime{"k3s", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl", "/run/k3s/containerd/containerd.sock"}
	containerdRKE2  = containerRuntime{"rke2", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl", "/run/k3s/containerd/containerd.sock"}
)

// runtimeOf is the containerd the node runs, from its kubelet's report:
// status.nodeInfo.containerRuntimeVersion (containerd://1.7.20,
// containerd://1.7.17-k3s1) and, for k3s's containerd, which RKE2 runs as
// well, its kubelet version (v1.30.2+k3s1, v1.30.2+rke2r1). ok is false
// for another runtime (cri-o, docker) or none reported.
func runtimeOf(n *corev1.Node) (rt containerRuntime, ok bool) {
	v, found := strings.CutPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://")
	switch kubelet := n.Status.NodeInfo.KubeletVersion; {
	case !found:
		return containerRuntime{}, false
	case strings.Contains(kubelet, "+rke2"):
		return containerdRKE2, true
	case strings.Contains(kubelet, "+k3s") || strings.Contains(v, "-k3s"):
		return containerdK3s, true
	}
	return containerdPlain, true
}

// toolkitRuntime is the containerd the toolkit's one DaemonSet configures:
// the one most GPU nodes meant for the toolkit run (by name on a tie),
// plain containerd where none reports one.
func toolkitRuntime(cp *gpuv1alpha1.ClusterPolicy, nodes []corev1.Node) containerRuntime {
	count := map[containerRuntime]int{}
	for i := range nodes {
		if rt, ok := runtimeOf(&nodes[i]); ok && meantFor(&nodes[i], cp, gpuv1alpha1.OperandToolkit) {
			count[rt]++
		}
	}
	best := containerdPlain
	for rt, n := range count {
		if n > count[best] || (n == count[best] && rt.name < best.name) {
			best = rt
		}
	}
	return best
}

// withRuntime points the toolkit's container at the runtime's config and
// socket (CONTAINERD_CONFIG, CONTAINERD_SOCKET), unless the policy's
// toolkit env sets them, and mounts the host directories of whichever
// paths it ends with, at the same paths: the policy may name a containerd
// of its own (a k0s, a custom data dir) by env alone.
func withRuntime(pod *corev1.PodSpec, cp *gpuv1alpha1.ClusterPolicy, rt containerRuntime) {
	c := &pod.Containers[0]
	set := func(name, value string) string {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
		if i < 0 {
			return ""
		}
		if !slices.ContainsFunc(cp.Spec.Toolkit.Env, func(e corev1.EnvVar) bool { return e.Name == name }) {
			c.Env[i].Value = value
		}
		return c.Env[i].Value
	}
	dirs := map[string]string{"containerd-config": path.Dir(set("CONTAINERD_CONFIG", rt.config)),
		"containerd-socket": path.Dir(set("CONTAINERD_SOCKET", rt.socket))}
	for i := range pod.Volumes {
		if d := dirs[pod.Volumes[i].Name]; d != "" && d != "." && pod.Volumes[i].HostPath != nil {
			pod.Volumes[i].HostPath.Path = d
		}
	}
	for i := range c.VolumeMounts {
		if d := dirs[c.VolumeMounts[i].Name]; d != "" && d != "." {
			c.VolumeMounts[i].MountPath = d
		}
	}
}
