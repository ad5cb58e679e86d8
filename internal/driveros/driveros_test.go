package driveros

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

func TestOf(t *testing.T) {
	nfd := func(id, v string) map[string]string {
		return map[string]string{gpuv1alpha1.LabelOSReleaseID: id, gpuv1alpha1.LabelOSReleaseVersionID: v}
	}
	tests := []struct {
		osImage string
		labels  map[string]string
		os, why string
		fromNFD bool
	}{
		{"Ubuntu 22.04.4 LTS", nil, "ubuntu22.04", "", false},
		{"Ubuntu 24.04 LTS", nil, "ubuntu24.04", "", false},
		{"Red Hat Enterprise Linux 9.4 (Plow)", nil, "rhel9.4", "", false},
		{"Red Hat Enterprise Linux CoreOS 416.94.202405291527-0 (Plow)", nil, "rhcos4.16", "", false},
		{"Red Hat Enterprise Linux CoreOS 9.6.20250530-0 (Plow)", nil, "", `rhcos version "9.6.20250530" not understood`, false},
		{"SUSE Linux Enterprise Server 15 SP6", nil, "sles15.6", "", false},
		{"Debian GNU/Linux 12 (bookworm)", nil, "", `OS "Debian GNU/Linux 12 (bookworm)" not recognised`, false},
		{"", nil, "", "OS unknown", false},
		// NFD lagging an OS upgrade: the kubelet's osImage is the running OS.
		{"Ubuntu 24.04.1 LTS", nfd("ubuntu", "22.04"), "ubuntu24.04", "", false},
		{"Red Hat Enterprise Linux 9.6 (Plow)", nfd("rhel", "9.4"), "rhel9.6", "", false},
		{"Ubuntu 24.04.1 LTS", nfd("rocky", "9.4"), "ubuntu24.04", "", false},
		// They agree, or the osImage names no OS with a driver image: NFD.
		{"Ubuntu 22.04.4 LTS", nfd("Ubuntu", "22.04"), "ubuntu22.04", "", true},
		{"Red Hat Enterprise Linux CoreOS 416.94.202405291527-0 (Plow)", nfd("rhcos", "4.16"), "rhcos4.16", "", true},
		{"SUSE Linux Enterprise Server 15 SP6", nfd("sles", "15.6"), "sles15.6", "", true},
		{"Debian GNU/Linux 12 (bookworm)", nfd("ubuntu", "22.04"), "ubuntu22.04", "", true},
		{"Red Hat Enterprise Linux CoreOS 9.6.20250530-0 (Plow)", nfd("rhcos", "4.16"), "rhcos4.16", "", true},
		{"", nfd("rhcos", "4.16"), "rhcos4.16", "", true},
		{"", nfd("rocky", "9.4"), "", "OS rocky not supported", true},
		{"Ubuntu 22.04.4 LTS", map[string]string{gpuv1alpha1.LabelOSReleaseID: "ubuntu"}, "ubuntu22.04", "", false},
	}
	for _, tt := range tests {
		got := Of(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: tt.labels},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: tt.osImage}}}, false)
		if got.OS != tt.os || got.Why != tt.why || got.NFD != tt.fromNFD {
			t.Errorf("%q %v: %+v, want os %q why %q nfd %v", tt.osImage, tt.labels, got, tt.os, tt.why, tt.fromNFD)
		}
	}
}

// A precompiled driver needs the node's kernel in its image tag: a kernel
// the tag cannot hold is a reason for no driver, as a missing one is.
func TestOfPrecompiledKernel(t *testing.T) {
	for kernel, why := range map[string]string{
		"5.15.0-105-generic":           "",
		"5.14.0-427.13.1.el9_4.x86_64": "",
		"":                             "kernel version unknown",
		"6.1.21-v8+":                   `kernel "6.1.21-v8+" makes no image tag`,
		"6.1.0 rc1":                    `kernel "6.1.0 rc1" makes no image tag`,
		"../../etc":                    `kernel "../../etc" makes no image tag`,
		strings.Repeat("5", 101):       `kernel "5555`,
	} {
		got := Of(&corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS", KernelVersion: kernel}}}, true)
		if !strings.HasPrefix(got.Why, why) || (why == "") != (got.Why == "") {
			t.Errorf("kernel %q: why %q, want %q", kernel, got.Why, why)
		}
	}
}
