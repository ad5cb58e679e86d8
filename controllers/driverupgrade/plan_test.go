package driverupgrade

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

func TestUpgradeBudget(t *testing.T) {
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	n := func(i int) *intstr.IntOrString { v := intstr.FromInt32(int32(i)); return &v }
	tests := []struct {
		parallel                  *int32
		unavailable               *intstr.IntOrString
		nodes, inProgress, failed int
		want                      int
	}{
		{nil, pct("25%"), 8, 0, 0, 1},              // defaults: one at a time
		{ptr.To[int32](2), pct("50%"), 6, 0, 0, 2}, // parallel bound
		{ptr.To[int32](2), pct("50%"), 6, 1, 0, 1},
		{ptr.To[int32](0), pct("25%"), 10, 0, 0, 3}, // unlimited parallel, 25% of 10 rounds up to 3
		{ptr.To[int32](0), n(4), 10, 4, 0, 0},
		{ptr.To[int32](5), pct("0%"), 10, 0, 0, 1}, // never stall completely
		{ptr.To[int32](2), nil, 1, 0, 0, 1},
		{ptr.To[int32](2), pct("25%"), 8, 0, 1, 1}, // a failed, cordoned node uses unavailability
		{ptr.To[int32](0), pct("25%"), 8, 0, 2, 0}, // failures cannot cordon the fleet
		{ptr.To[int32](1), nil, 8, 0, 5, 1},        // without maxUnavailable, failures do not stop the rollout
	}
	for _, tt := range tests {
		p := gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: tt.parallel, MaxUnavailable: tt.unavailable}
		if got := UpgradeBudget(p, tt.nodes, tt.inProgress, tt.failed); got != tt.want {
			t.Errorf("UpgradeBudget(parallel %v, unavailable %v, %d nodes, %d in progress, %d failed) = %d, want %d",
				tt.parallel, tt.unavailable, tt.nodes, tt.inProgress, tt.failed, got, tt.want)
		}
	}
}

// gpuNode is a GPU node (as the cache has it) in state, with annotations
// given as key, value pairs.
func gpuNode(name, state string, ann ...string) metav1.PartialObjectMetadata {
	n := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
	if state != "" {
		n.Labels[gpuv1alpha1.LabelUpgradeState] = state
	}
	for i := 0; i+1 < len(ann); i += 2 {
		n.Annotations[ann[i]] = ann[i+1]
	}
	return n
}

func showWork(todo []work) string {
	var out []string
	for _, w := range todo {
		if w.start {
			out = append(out, "start "+w.node)
		} else {
			out = append(out, w.node)
		}
	}
	return strings.Join(out, ", ")
}

func TestPlan(t *testing.T) {
	old, ready, starting := driverPod("old-template", true), driverPod(wanted, true), driverPod(wanted, false)
	one := gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1)}
	two := gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](2)}
	manual := gpuv1alpha1.DriverUpgradePolicy{AutoUpgrade: ptr.To(false)}
	failedOn := func(tmpl string) []string { return []string{gpuv1alpha1.AnnotationFailedTemplate, tmpl} }
	tests := []struct {
		name    string
		nodes   []metav1.PartialObjectMetadata
		drivers map[string]*corev1.Pod
		policy  gpuv1alpha1.DriverUpgradePolicy
		want    string
		more    bool
		err     string
	}{
		{name: "all current", nodes: []metav1.PartialObjectMetadata{gpuNode("a", ""), gpuNode("b", gpuv1alpha1.UpgradeDone)},
			drivers: map[string]*corev1.Pod{"a": ready, "b": ready}, policy: one},
		{name: "one at a time", nodes: []metav1.PartialObjectMetadata{gpuNode("a", ""), gpuNode("b", ""), gpuNode("c", "")},
			drivers: map[string]*corev1.Pod{"a": old, "b": old, "c": old}, policy: one, want: "start a", more: true},
		{name: "in progress uses the budget", nodes: []metav1.PartialObjectMetadata{gpuNode("a", gpuv1alpha1.DrainRequired), gpuNode("b", ""), gpuNode("c", "")},
			drivers: map[string]*corev1.Pod{"a": old, "b": old, "c": old}, policy: two, want: "a, start b", more: true},
		{name: "no driver pod yet is not outdated", nodes: []metav1.PartialObjectMetadata{gpuNode("a", "")}, policy: one},
		{name: "autoUpgrade off", nodes: []metav1.PartialObjectMetadata{gpuNode("a", ""), gpuNode("b", gpuv1alpha1.ValidationRequired)},
			drivers: map[string]*corev1.Pod{"a": old, "b": starting}, policy: manual, want: "b", more: true},
		{name: "failed on this template waits", nodes: []metav1.PartialObjectMetadata{gpuNode("a", gpuv1alpha1.UpgradeFailed, failedOn(wanted)...)},
			drivers: map[string]*corev1.Pod{"a": old}, policy: two},
		{name: "failed on an older template is retried", nodes: []metav1.PartialObjectMetadata{gpuNode("a", gpuv1alpha1.UpgradeFailed, failedOn("older")...)},
			drivers: map[string]*corev1.Pod{"a": old}, policy: two, want: "start a", more: true},
		{name: "failed, wanted driver ready: finishes", nodes: []metav1.PartialObjectMetadata{gpuNode("a", gpuv1alpha1.UpgradeFailed, failedOn(wanted)...)},
			drivers: map[string]*corev1.Pod{"a": ready}, policy: two, want: "a", more: true},
		{name: "failed nodes hold maxUnavailable", policy: gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0), MaxUnavailable: ptr.To(intstr.FromInt32(1))},
			nodes:   []metav1.PartialObjectMetadata{gpuNode("a", gpuv1alpha1.UpgradeFailed, failedOn(wanted)...), gpuNode("b", "")},
			drivers: map[string]*corev1.Pod{"a": old, "b": old}, more: true},
		{name: "bad selector starts nothing", nodes: []metav1.PartialObjectMetadata{gpuNode("a", gpuv1alpha1.DrainRequired), gpuNode("b", "")},
			drivers: map[string]*corev1.Pod{"a": old, "b": old},
			policy:  gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](2), Drain: &gpuv1alpha1.DrainSpec{PodSelector: "x in ("}},
			err:     "not starting driver upgrades: drain.podSelector"},
		{name: "bad selector, nothing to start", nodes: []metav1.PartialObjectMetadata{gpuNode("a", gpuv1alpha1.DrainRequired)},
			drivers: map[string]*corev1.Pod{"a": old},
			policy:  gpuv1alpha1.DriverUpgradePolicy{WaitForCompletion: &gpuv1alpha1.WaitForCompletionSpec{PodSelector: "x in ("}},
			want:    "a", more: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			todo, more, err := plan(tt.nodes, tt.drivers, tt.policy, wanted)
			errOK := (err == nil && tt.err == "") || (err != nil && tt.err != "" && strings.Contains(err.Error(), tt.err))
			if got := showWork(todo); got != tt.want || more != tt.more || !errOK {
				t.Errorf("plan = %q, more %v, err %v; want %q, %v, %q", got, more, err, tt.want, tt.more, tt.err)
			}
		})
	}
}

// A policy the API server would now reject (stored before its rule) starts
// no node, and says which field is wrong; a node in a state Loom does not
// know is left alone and holds maxUnavailable like a failed one.
func TestPlanRefusesInvalidPolicies(t *testing.T) {
	old := driverPod("old-template", true)
	nodes := []metav1.PartialObjectMetadata{gpuNode("a", ""), gpuNode("b", "")}
	drivers := map[string]*corev1.Pod{"a": old, "b": old}
	zero, half := intstr.FromInt32(0), intstr.FromString("half")
	for name, tt := range map[string]struct {
		p   gpuv1alpha1.DriverUpgradePolicy
		err string
	}{
		"maxUnavailable 0":        {gpuv1alpha1.DriverUpgradePolicy{MaxUnavailable: &zero}, "maxUnavailable: Invalid value: \"0\""},
		"maxUnavailable garbage":  {gpuv1alpha1.DriverUpgradePolicy{MaxUnavailable: &half}, "maxUnavailable: Invalid value: \"half\""},
		"negative parallel":       {gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](-1)}, "maxParallelUpgrades"},
		"wait selector":           {gpuv1alpha1.DriverUpgradePolicy{WaitForCompletion: &gpuv1alpha1.WaitForCompletionSpec{PodSelector: "a,,b"}}, "waitForCompletion.podSelector"},
		"negative drain timeout":  {gpuv1alpha1.DriverUpgradePolicy{Drain: &gpuv1alpha1.DrainSpec{TimeoutSeconds: -1}}, "drain.timeoutSeconds"},
		"negative delete timeout": {gpuv1alpha1.DriverUpgradePolicy{PodDeletion: &gpuv1alpha1.PodDeletionSpec{TimeoutSeconds: -1}}, "podDeletion.timeoutSeconds"},
	} {
		todo, _, err := plan(nodes, drivers, tt.p, wanted)
		if len(todo) != 0 || err == nil || !strings.Contains(err.Error(), "not starting driver upgrades: "+tt.err) {
			t.Errorf("%s: plan = %q, %v; want nothing started and an error naming %s", name, showWork(todo), err, tt.err)
		}
	}
	one := ptr.To(intstr.FromInt32(1))
	unknown := []metav1.PartialObjectMetadata{gpuNode("a", "Upgrade-Done"), gpuNode("b", "")}
	todo, _, err := plan(unknown, drivers, gpuv1alpha1.DriverUpgradePolicy{MaxUnavailable: one}, wanted)
	if len(todo) != 0 || err != nil {
		t.Errorf("unknown state holding maxUnavailable 1: plan = %q, %v; want nothing", showWork(todo), err)
	}
	todo, _, err = plan(unknown, drivers, gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1)}, wanted)
	if showWork(todo) != "start b" || err != nil {
		t.Errorf("unknown state: plan = %q, %v; want b started, a left alone", showWork(todo), err)
	}
}
