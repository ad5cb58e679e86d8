package clusterpolicy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

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

// Precompiled drivers name their DaemonSet after the OS and kernel: two
// kernels that differ only in what a name cannot hold get a DaemonSet
// each, each with its own kernel's image; a kernel no image tag can hold
// gives that node no driver, saying why, instead of a DaemonSet whose
// pods cannot pull.
func TestPrecompiledKernelsNameTheirOwnDaemonSet(t *testing.T) {
	node := func(name, kernel string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: "Ubuntu 22.04.4 LTS", KernelVersion: kernel}}}
	}
	cp := &gpuv1alpha1.ClusterPolicy{}
	cp.Spec.Driver.UsePrecompiled = true
	long := "5.15.0-" + strings.Repeat("x", 60)
	groups, noDriver := driverGroups(cp, []corev1.Node{
		node("a", "5.15.0-105-generic"), node("b", "5.15.0-105-Generic"), node("c", "5.15.0-105_generic"),
		node("d", "6.8.0-1015-gcp"), node("e", long+"-1"), node("f", long+"-2"),
		node("g", "6.1.21-v8+"), node("h", "6.1.0 rc1"), node("i", "6.1.0-"+strings.Repeat("y", 120)),
	})
	tags, targets := map[string]string{}, map[string]bool{}
	for _, g := range groups {
		if targets[g.target] {
			t.Errorf("two groups named %s", g.target)
		}
		targets[g.target] = true
		if len(g.target) > 50 || len(validation.IsDNS1123Subdomain("loom-driver-"+g.target)) > 0 || len(validation.IsValidLabelValue(g.target)) > 0 {
			t.Errorf("target %q is no name", g.target)
		}
		for _, n := range g.names {
			tags[n] = g.tag
		}
	}
	for n, kernel := range map[string]string{"a": "5.15.0-105-generic", "b": "5.15.0-105-Generic", "c": "5.15.0-105_generic",
		"d": "6.8.0-1015-gcp", "e": long + "-1", "f": long + "-2"} {
		if want := "570-" + kernel + "-ubuntu22.04"; tags[n] != want {
			t.Errorf("node %s gets %q, want %q", n, tags[n], want)
		}
	}
	if !targets["ubuntu22.04-6.8.0-1015-gcp"] {
		t.Errorf("a kernel no other shares changed its name: %v", targets)
	}
	if len(noDriver) != 3 || !strings.HasPrefix(noDriver[0], "g (kernel \"6.1.21-v8+\" makes no image tag") ||
		!strings.HasPrefix(noDriver[1], "h (kernel") || !strings.HasPrefix(noDriver[2], "i (kernel") {
		t.Errorf("no driver %q", noDriver)
	}
}
