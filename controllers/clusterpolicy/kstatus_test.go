package clusterpolicy

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/testenv"
)

// kstatusOf is what cli-utils' kstatus (Helm's --wait, Flux) reads from
// the policy.
func kstatusOf(t *testing.T, cp *gpuv1alpha1.ClusterPolicy) kstatus.Status {
	return testenv.KStatus(t, cp, gpuv1alpha1.GroupVersion.WithKind("ClusterPolicy"))
}

// kstatus reads a ready stack Current, one rolling out (or waiting for GPU
// nodes, or retrying a write) InProgress, an invalid or ignored policy
// Failed, and a spec the reconciler has not seen yet InProgress.
func TestKstatus(t *testing.T) {
	rolling := rolledOut(2)
	rolling.Status.UpdatedNumberScheduled = 1
	rollingOut := allRolledOut(2)
	rollingOut["device-plugin"] = rolling
	invalid := gpuv1alpha1.ClusterPolicySpec{}
	invalid.DCGMExporter.NodeSelector = map[string]string{strings.Repeat("k", 64): "v"}
	tests := []struct {
		name      string
		spec      gpuv1alpha1.ClusterPolicySpec
		obs       observed
		writeErrs []string
		ignored   bool
		want      kstatus.Status
	}{
		{"ready", gpuv1alpha1.ClusterPolicySpec{}, observed{active: "default", gpuNodes: 2, daemonSets: allRolledOut(2)}, nil, false, kstatus.CurrentStatus},
		{"rolling out", gpuv1alpha1.ClusterPolicySpec{}, observed{active: "default", gpuNodes: 2, daemonSets: rollingOut}, nil, false, kstatus.InProgressStatus},
		{"no GPU nodes", gpuv1alpha1.ClusterPolicySpec{}, observed{active: "default", daemonSets: allRolledOut(0)}, nil, false, kstatus.InProgressStatus},
		{"write failed", gpuv1alpha1.ClusterPolicySpec{}, observed{active: "default", gpuNodes: 2, daemonSets: allRolledOut(2)}, []string{"applying DaemonSet x: boom"}, false, kstatus.InProgressStatus},
		{"invalid", invalid, observed{active: "default", gpuNodes: 2, daemonSets: allRolledOut(2)}, nil, false, kstatus.FailedStatus},
		{"another policy in force", gpuv1alpha1.ClusterPolicySpec{}, observed{}, nil, true, kstatus.FailedStatus},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Generation: 3}, Spec: tt.spec}
			if tt.ignored {
				cp.Status = *ignoredStatus(cp, "first")
			} else {
				cp.Status = *status(cp, tt.obs, tt.writeErrs)
			}
			if got := kstatusOf(t, cp); got != tt.want {
				t.Fatalf("kstatus %s, want %s (conditions %+v)", got, tt.want, cp.Status.Conditions)
			}
			cp.Generation++
			if got := kstatusOf(t, cp); got != kstatus.InProgressStatus {
				t.Fatalf("kstatus of an unobserved generation %s, want InProgress", got)
			}
		})
	}
}

// A new driver version with autoUpgrade false leaves the nodes on the older
// driver: the policy is not Ready (as GPU Operator reports an OnDelete
// driver DaemonSet whose pods are of an older revision notReady), Ready's
// reason says why, and kstatus reads InProgress, not Current: kubectl wait,
// Flux and Argo CD do not take the new version for rolled out.
func TestKstatusAutoUpgradeDisabled(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default", Generation: 3}}
	cp.Status.Conditions = []metav1.Condition{{Type: gpuv1alpha1.ConditionDriverUpgrade, Status: metav1.ConditionFalse,
		Reason: gpuv1alpha1.ReasonAutoUpgradeDisabled, Message: "autoUpgrade is false: 2 GPU nodes run an older driver"}}
	cp.Status = *status(cp, observed{active: "default", gpuNodes: 2, daemonSets: allRolledOut(2)}, nil)
	ready := meta.FindStatusCondition(cp.Status.Conditions, conditionReady)
	if cp.Status.State != gpuv1alpha1.PolicyNotReady || ready == nil || ready.Status != metav1.ConditionFalse ||
		ready.Reason != gpuv1alpha1.ReasonAutoUpgradeDisabled || !strings.Contains(ready.Message, "2 GPU nodes run an older driver") {
		t.Fatalf("state %s, Ready %+v; want notReady, False %s naming the nodes", cp.Status.State, ready, gpuv1alpha1.ReasonAutoUpgradeDisabled)
	}
	if got := kstatusOf(t, cp); got != kstatus.InProgressStatus {
		t.Fatalf("kstatus %s, want InProgress (conditions %+v)", got, cp.Status.Conditions)
	}
}
