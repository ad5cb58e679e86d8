package clusterpolicy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

func TestOSOf(t *testing.T) {
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
		{"Ubuntu 20.04.6 LTS", nfd("ubuntu", "22.04"), "ubuntu22.04", "", true},
		{"", nfd("rhcos", "4.16"), "rhcos4.16", "", true},
		{"", nfd("rocky", "9.4"), "", "OS rocky not supported", true},
		{"Ubuntu 22.04.4 LTS", map[string]string{gpuv1alpha1.LabelOSReleaseID: "ubuntu"}, "ubuntu22.04", "", false},
	}
	for _, tt := range tests {
		got := osOf(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: tt.labels},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: tt.osImage}}})
		if got.os != tt.os || got.why != tt.why || got.nfd != tt.fromNFD {
			t.Errorf("%q %v: %+v, want os %q why %q nfd %v", tt.osImage, tt.labels, got, tt.os, tt.why, tt.fromNFD)
		}
	}
}

// A version naming its OS is one DaemonSet for every node; a plain one
// splits by OS, and by OS and kernel when precompiled.
func TestDriverGroups(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	groups, noDriver := driverGroups(cp, testFleet().nodes)
	if len(groups) != 2 || groups[0].target != "rhel9.4" || groups[1].target != "ubuntu22.04" || groups[1].tag != "570.172.08-ubuntu22.04" {
		t.Errorf("groups %+v", groups)
	}
	if len(noDriver) != 2 {
		t.Errorf("no driver %v", noDriver)
	}
	cp.Spec.Driver.Image.Version = "570.172.08-ubuntu22.04"
	if groups, noDriver := driverGroups(cp, testFleet().nodes); len(groups) != 1 || groups[0].target != "" || len(noDriver) != 0 {
		t.Errorf("suffixed version: %+v %v", groups, noDriver)
	}
	cp.Spec.Driver.Image.Version, cp.Spec.Driver.UsePrecompiled = "", true
	groups, _ = driverGroups(cp, testFleet().nodes)
	if len(groups) != 2 || groups[1].tag != "570-5.15.0-105-generic-ubuntu22.04" || len(groups[1].names) != 2 || groups[1].nfdIDs != nil {
		t.Errorf("precompiled: %+v", groups)
	}
	if long := dnsSafe("ubuntu22.04-" + string(make([]byte, 80))); len(long) > 50 {
		t.Errorf("dnsSafe kept %d characters", len(long))
	}
}
