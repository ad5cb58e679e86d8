package manager

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The cached Node keeps what the ClusterPolicy reads of its nodeInfo: the
// OS image and kernel (driver images), the container runtime and kubelet
// versions (the containerd the toolkit configures), and nothing else.
func TestTrimNodeKeepsWhatThePolicyReads(t *testing.T) {
	in := &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS", KernelVersion: "5.15.0-105-generic",
		ContainerRuntimeVersion: "containerd://1.7.17-k3s1", KubeletVersion: "v1.30.2+rke2r1", MachineID: "m", BootID: "b"}}}
	out, err := trimNode(in)
	if err != nil {
		t.Fatal(err)
	}
	want := corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS", KernelVersion: "5.15.0-105-generic",
		ContainerRuntimeVersion: "containerd://1.7.17-k3s1", KubeletVersion: "v1.30.2+rke2r1"}
	if got := out.(*corev1.Node).Status.NodeInfo; got != want {
		t.Errorf("cached nodeInfo %+v, want %+v", got, want)
	}
}
