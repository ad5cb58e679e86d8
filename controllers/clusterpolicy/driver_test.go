package clusterpolicy

import (
	"testing"

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
