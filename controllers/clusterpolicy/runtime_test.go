package clusterpolicy

import (
	"path"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// A node's containerd, as its kubelet reports it: plain, k3s's (its
// version says k3s, and so does its kubelet's) or RKE2's (k3s's containerd,
// an RKE2 kubelet); other runtimes are none the toolkit configures.
func TestRuntimeOf(t *testing.T) {
	for _, tt := range []struct {
		runtime, kubelet string
		want             containerRuntime
		ok               bool
	}{
		{"containerd://1.7.20", "v1.30.2", containerdPlain, true},
		{"containerd://2.0.0", "v1.31.1-eks-a737599", containerdPlain, true},
		{"containerd://1.7.17-k3s1", "v1.30.2+k3s1", containerdK3s, true},
		{"containerd://1.7.17-k3s1", "v1.30.2+rke2r1", containerdRKE2, true},
		{"containerd://1.7.17-k3s1.27", "v1.27.16+rke2r2", containerdRKE2, true},
		{"cri-o://1.29.1", "v1.29.1", containerRuntime{}, false},
		{"docker://24.0.7", "v1.28.3", containerRuntime{}, false},
		{"", "", containerRuntime{}, false},
	} {
		n := &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{ContainerRuntimeVersion: tt.runtime, KubeletVersion: tt.kubelet}}}
		if got, ok := runtimeOf(n); got != tt.want || ok != tt.ok {
			t.Errorf("%s, kubelet %s: %+v %v, want %+v %v", tt.runtime, tt.kubelet, got, ok, tt.want, tt.ok)
		}
	}
}

// The toolkit configures the containerd its GPU nodes run, at its own
// config and socket, mounted from the host where its env points: RKE2's
// and k3s's under /var/lib/rancher and /run/k3s, plain containerd's under
// /etc/containerd and /run/containerd; the policy's toolkit env names
// another (k0s, a custom data dir) and the mounts follow it.
func TestToolkitConfiguresTheNodesContainerd(t *testing.T) {
	node := func(name, runtime, kubelet string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{gpuv1alpha1.LabelPresent: "true"}},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS", ContainerRuntimeVersion: runtime, KubeletVersion: kubelet}}}
	}
	rke2, k3s, plain := node("a", "containerd://1.7.17-k3s1", "v1.30.2+rke2r1"), node("b", "containerd://1.7.17-k3s1", "v1.30.2+k3s1"), node("c", "containerd://1.7.20", "v1.30.2")
	for _, tt := range []struct {
		name           string
		nodes          []corev1.Node
		env            []corev1.EnvVar
		config, socket string
	}{
		{"RKE2", []corev1.Node{rke2}, nil, containerdRKE2.config, containerdRKE2.socket},
		{"k3s", []corev1.Node{k3s, node("d", "cri-o://1.29.1", "v1.29.1")}, nil, containerdK3s.config, containerdK3s.socket},
		{"plain", []corev1.Node{plain}, nil, containerdPlain.config, containerdPlain.socket},
		{"most nodes' runtime", []corev1.Node{rke2, plain, node("e", "containerd://1.7.17-k3s1", "v1.30.2+rke2r1")}, nil, containerdRKE2.config, containerdRKE2.socket},
		{"none reported", nil, nil, containerdPlain.config, containerdPlain.socket},
		{"the policy's", []corev1.Node{rke2}, []corev1.EnvVar{{Name: "CONTAINERD_CONFIG", Value: "/etc/k0s/containerd.toml"}},
			"/etc/k0s/containerd.toml", containerdRKE2.socket},
	} {
		cp := &gpuv1alpha1.ClusterPolicy{}
		cp.Spec.Toolkit.Env = tt.env
		var spec *corev1.PodSpec
		for _, o := range desired(cp, "loom-system", cluster{nodes: tt.nodes}).objects {
			if ds, ok := o.(*appsv1.DaemonSet); ok && ds.Name == "loom-container-toolkit" {
				spec = &ds.Spec.Template.Spec
			}
		}
		if spec == nil {
			t.Fatalf("%s: no toolkit DaemonSet", tt.name)
		}
		env, hostDirs, mounts := map[string]string{}, map[string]string{}, map[string]string{}
		for _, e := range spec.Containers[0].Env {
			env[e.Name] = e.Value
		}
		for _, v := range spec.Volumes {
			if v.HostPath != nil {
				hostDirs[v.Name] = v.HostPath.Path
			}
		}
		for _, m := range spec.Containers[0].VolumeMounts {
			mounts[m.Name] = m.MountPath
		}
		if env["RUNTIME"] != "containerd" || env["CONTAINERD_CONFIG"] != tt.config || env["CONTAINERD_SOCKET"] != tt.socket {
			t.Errorf("%s: toolkit env %v, want containerd at %s and %s", tt.name, env, tt.config, tt.socket)
		}
		for volume, file := range map[string]string{"containerd-config": tt.config, "containerd-socket": tt.socket} {
			if hostDirs[volume] != path.Dir(file) || mounts[volume] != path.Dir(file) {
				t.Errorf("%s: %s from the host's %s at %s, want %s at its own path", tt.name, volume, hostDirs[volume], mounts[volume], path.Dir(file))
			}
		}
	}
}
