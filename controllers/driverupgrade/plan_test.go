package driverupgrade

import (
	"fmt"
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
		parallel                *int32
		unavailable             *intstr.IntOrString
		nodes, inProgress, down int
		want                    int
	}{
		{nil, pct("25%"), 8, 0, 0, 1},              // defaults: one at a time
		{ptr.To[int32](2), pct("50%"), 6, 0, 0, 2}, // parallel bound
		{ptr.To[int32](2), pct("50%"), 6, 1, 1, 1},
		{ptr.To[int32](0), pct("25%"), 10, 0, 0, 3}, // unlimited parallel, 25% of 10 rounds up to 3
		{ptr.To[int32](0), n(4), 10, 4, 4, 0},
		{ptr.To[int32](0), n(4), 10, 1, 3, 1},      // cordoned or NotReady nodes, Loom's or not, use unavailability
		{ptr.To[int32](5), pct("0%"), 10, 0, 0, 1}, // never stall completely
		{ptr.To[int32](2), nil, 1, 0, 0, 1},
		{ptr.To[int32](2), pct("25%"), 8, 0, 1, 1}, // a failed, cordoned node uses unavailability
		{ptr.To[int32](0), pct("25%"), 8, 0, 2, 0}, // failures cannot cordon the fleet
		{ptr.To[int32](1), nil, 8, 0, 5, 1},        // without maxUnavailable, failures do not stop the rollout
	}
	for _, tt := range tests {
		p := gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: tt.parallel, MaxUnavailable: tt.unavailable}
		if got := UpgradeBudget(p, tt.nodes, tt.inProgress, tt.down); got != tt.want {
			t.Errorf("UpgradeBudget(parallel %v, unavailable %v, %d nodes, %d in progress, %d unavailable) = %d, want %d",
				tt.parallel, tt.unavailable, tt.nodes, tt.inProgress, tt.down, got, tt.want)
		}
	}
}

// readyNode is a Ready, schedulable GPU node in state (claimed by the
// policy when in one).
func readyNode(name, state string) *corev1.Node {
	n := node(state, false)
	n.Name = name
	delete(n.Annotations, gpuv1alpha1.AnnotationPhaseStarted)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	return n
}

// gpuNode is a node of the set in state, its driver pod of template
// driver ("" none, ready unless it ends in " starting"), with options.
func gpuNode(name, state, driver string, opts ...func(*nodeView)) nodeView {
	v := nodeView{node: readyNode(name, state), target: wanted}
	if driver != "" {
		tmpl, starting := strings.CutSuffix(driver, " starting")
		v.driver = driverPod(tmpl, !starting)
	}
	for _, o := range opts {
		o(&v)
	}
	return v
}

func ann(k, v string) func(*nodeView) { return func(n *nodeView) { n.node.Annotations[k] = v } }
func foreign(n *nodeView)             { delete(n.node.Annotations, gpuv1alpha1.AnnotationClaim) }
func cordoned(n *nodeView)            { n.node.Spec.Unschedulable = true }
func notReady(n *nodeView)            { n.node.Status.Conditions[0].Status = corev1.ConditionFalse }

// outside: no driver DaemonSet of the policy selects the node any more.
func outside(n *nodeView) { n.unplaced = true }
func targets(t string) func(*nodeView) {
	return func(n *nodeView) { n.target = t }
}

func showWork(todo []work) string {
	var out []string
	for _, w := range todo {
		switch {
		case w.start:
			out = append(out, "start "+w.node)
		case w.leave:
			out = append(out, "leave "+w.node)
		default:
			out = append(out, w.node)
		}
	}
	return strings.Join(out, ", ")
}

func TestPlan(t *testing.T) {
	const old = "old-template"
	one := gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1)}
	two := gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](2)}
	all := gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0)}
	manual := gpuv1alpha1.DriverUpgradePolicy{AutoUpgrade: ptr.To(false)}
	failures := func(n int32) gpuv1alpha1.DriverUpgradePolicy {
		return gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0), MaxFailures: &n}
	}
	failedOn := func(tmpl string) func(*nodeView) { return ann(gpuv1alpha1.AnnotationFailedTemplate, tmpl) }
	acked := ann(gpuv1alpha1.AnnotationFailureAcknowledged, "true")
	lost := ann(gpuv1alpha1.AnnotationFailedNotReady, "true")
	failed := gpuv1alpha1.UpgradeFailed
	tests := []struct {
		name   string
		nodes  []nodeView
		policy gpuv1alpha1.DriverUpgradePolicy
		resume bool
		want   string
		more   bool
		err    string
		paused bool
		ack    string
		// recheck: a failed node to retry is NotReady, the pass comes back
		// for it.
		recheck bool
	}{
		{name: "all current", nodes: []nodeView{gpuNode("a", "", wanted), gpuNode("b", gpuv1alpha1.UpgradeDone, wanted)}, policy: one},
		{name: "one at a time", nodes: []nodeView{gpuNode("a", "", old), gpuNode("b", "", old), gpuNode("c", "", old)}, policy: one, want: "start a", more: true},
		{name: "in progress uses the budget", nodes: []nodeView{gpuNode("a", gpuv1alpha1.DrainRequired, old), gpuNode("b", "", old), gpuNode("c", "", old)},
			policy: two, want: "a, start b", more: true},
		{name: "no driver pod yet is not outdated", nodes: []nodeView{gpuNode("a", "", "")}, policy: one},
		{name: "a driver pod of no DaemonSet of the policy is not outdated", nodes: []nodeView{gpuNode("a", "", old, targets(""))}, policy: one},
		{name: "each node against its own DaemonSet's template", policy: all, want: "start b", more: true,
			nodes: []nodeView{gpuNode("a", "", "rhel", targets("rhel")), gpuNode("b", "", "rhel", targets("ubuntu"))}},
		{name: "autoUpgrade off", nodes: []nodeView{gpuNode("a", "", old), gpuNode("b", gpuv1alpha1.ValidationRequired, wanted+" starting")},
			policy: manual, want: "b", more: true},

		// Labels without Loom's claim are neither stepped nor counted.
		{name: "foreign labels on five nodes start no five upgrades", policy: one, want: "start f", more: true,
			nodes: []nodeView{gpuNode("a", gpuv1alpha1.DrainRequired, old, foreign), gpuNode("b", gpuv1alpha1.UpgradeRequired, old, foreign),
				gpuNode("c", gpuv1alpha1.PodRestartRequired, old, foreign), gpuNode("d", gpuv1alpha1.ValidationRequired, old, foreign),
				gpuNode("e", failed, old, foreign), gpuNode("f", "", old), gpuNode("g", "", old)}},
		{name: "another policy's claim is foreign", policy: one, nodes: []nodeView{gpuNode("a", gpuv1alpha1.DrainRequired, old, ann(gpuv1alpha1.AnnotationClaim, "other"))}},
		{name: "a foreign upgrade-done is idle", policy: one, want: "start a", more: true, nodes: []nodeView{gpuNode("a", gpuv1alpha1.UpgradeDone, old, foreign)}},
		{name: "an unknown state is ignored", policy: one, want: "start b", more: true, nodes: []nodeView{gpuNode("a", "Upgrade-Done", old), gpuNode("b", "", old)}},
		{name: "a claimed node whose label went is let go, in the budget", policy: one, want: "a", more: true,
			nodes: []nodeView{gpuNode("a", "", old, ann(gpuv1alpha1.AnnotationClaim, policy)), gpuNode("b", "", old)}},

		// maxUnavailable counts every unavailable GPU node, Loom's or not.
		{name: "cordoned by someone else holds maxUnavailable", policy: gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0), MaxUnavailable: ptr.To(intstr.FromInt32(2))},
			nodes: []nodeView{gpuNode("a", "", wanted, cordoned), gpuNode("b", "", wanted, notReady), gpuNode("c", "", old)}, more: true},
		{name: "a foreign-labelled cordoned node holds maxUnavailable", policy: gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0), MaxUnavailable: ptr.To(intstr.FromInt32(2))},
			nodes: []nodeView{gpuNode("a", gpuv1alpha1.DrainRequired, old, foreign, cordoned), gpuNode("b", "", old), gpuNode("c", "", old)}, want: "start b", more: true},
		{name: "failed nodes hold maxUnavailable", policy: gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](0), MaxUnavailable: ptr.To(intstr.FromInt32(1)), MaxFailures: ptr.To[int32](0)},
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted), cordoned), gpuNode("b", "", old)}, more: true},

		// Failures: retried on a new template, paused at maxFailures.
		{name: "failed on this template waits, and pauses", nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted)), gpuNode("b", "", old)}, policy: two,
			paused: true, more: true},
		{name: "failed on an older template is retried", nodes: []nodeView{gpuNode("a", failed, old, failedOn("older"))}, policy: two, want: "start a", more: true},
		// Retrying a node still cordoned from its failure makes no further
		// node unavailable: its own cordon does not hold it back, the others'
		// budget stays.
		{name: "failed and cordoned on an older template is retried within maxUnavailable", want: "start a", more: true,
			policy: gpuv1alpha1.DriverUpgradePolicy{MaxUnavailable: ptr.To(intstr.FromString("25%"))},
			nodes:  []nodeView{gpuNode("a", failed, old, failedOn("older"), cordoned), gpuNode("b", "", old), gpuNode("c", "", old), gpuNode("d", "", old)}},
		{name: "a NotReady outdated node is no failed one: maxUnavailable holds", more: true,
			policy: gpuv1alpha1.DriverUpgradePolicy{MaxUnavailable: ptr.To(intstr.FromInt32(1))},
			nodes:  []nodeView{gpuNode("a", "", old, notReady), gpuNode("b", "", old)}},
		{name: "failed on an older template, NotReady: not started until Ready", policy: two, recheck: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn("older"), cordoned, notReady)}},
		{name: "the retried node takes the parallel slot", want: "start b", more: true,
			policy: gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1), MaxUnavailable: ptr.To(intstr.FromInt32(2))},
			nodes:  []nodeView{gpuNode("a", "", old), gpuNode("b", failed, old, failedOn("older"), cordoned), gpuNode("c", "", old)}},
		{name: "failed, wanted driver starting: looked at again", nodes: []nodeView{gpuNode("a", failed, wanted+" starting", failedOn(wanted))}, policy: two,
			paused: true, recheck: true},
		{name: "failed, wanted driver ready: finishes", nodes: []nodeView{gpuNode("a", failed, wanted, failedOn(wanted))}, policy: two, want: "a", more: true, paused: true},
		{name: "maxFailures 2: one failure goes on", nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted)), gpuNode("b", "", old)}, policy: failures(2),
			want: "start b", more: true},
		{name: "maxFailures 2: two failures pause", policy: failures(2), paused: true, more: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted)), gpuNode("b", failed, old, failedOn(wanted)), gpuNode("c", "", old)}},
		{name: "maxFailures 0 never pauses", policy: failures(0), want: "start c", more: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted)), gpuNode("b", failed, old, failedOn(wanted)), gpuNode("c", "", old)}},
		{name: "paused, in-progress nodes still step", policy: failures(1), want: "b", paused: true, more: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted)), gpuNode("b", gpuv1alpha1.DrainRequired, old), gpuNode("c", "", old)}},
		{name: "a foreign failed node does not pause", policy: failures(1), want: "start b", more: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted), foreign), gpuNode("b", "", old)}},
		{name: "resume acknowledges the failures and goes on", policy: failures(1), resume: true, want: "start c", more: true, ack: "a",
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted)), gpuNode("c", "", old)}},
		{name: "acknowledged failures do not count", policy: failures(1), want: "start c", more: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted), acked), gpuNode("c", "", old)}},
		{name: "a failure after the resume pauses again", policy: failures(1), paused: true, more: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted), acked), gpuNode("b", failed, old, failedOn(wanted)), gpuNode("c", "", old)}},

		// A node lost mid-upgrade (NotReady past notReadyTimeout) failed: it
		// frees its slot and counts towards maxFailures while NotReady (a
		// driver that crashes its node is what maxFailures stops); Ready
		// again, it retries first, and counts no more.
		{name: "a lost node frees its slot", policy: gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1), MaxFailures: ptr.To[int32](0)},
			want: "start b", more: true, recheck: true, nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted), lost, notReady, cordoned), gpuNode("b", "", old)}},
		{name: "a lost node still NotReady pauses, and is looked at again", policy: one, paused: true, more: true, recheck: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted), lost, notReady, cordoned), gpuNode("b", "", old)}},
		{name: "a lost node Ready again retries first, and no longer pauses", policy: one, want: "start a", more: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted), lost, cordoned), gpuNode("b", "", old)}},
		{name: "a lost node Ready again, its driver pod gone, retries", policy: one, want: "start a", more: true,
			nodes: []nodeView{gpuNode("a", failed, "", failedOn(wanted), lost, cordoned)}},
		{name: "a lost node Ready again on the wanted driver finishes", policy: one, want: "a", more: true,
			nodes: []nodeView{gpuNode("a", failed, wanted, failedOn(wanted), lost, cordoned)}},
		{name: "a lost node Ready again, autoUpgrade off: stays failed", policy: manual, paused: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted), lost, cordoned)}},

		// A node no driver DaemonSet selects any more (opted out, relabelled,
		// tainted, the selector changed) can never run the new driver: it
		// is not started, and one claimed leaves its upgrade, failed or
		// not, without counting as a failure.
		{name: "an outdated node the driver no longer selects is not started", policy: one,
			nodes: []nodeView{gpuNode("a", "", old, outside)}},
		{name: "an upgrading node the driver no longer selects leaves, in the budget this pass", policy: one, want: "leave a", more: true,
			nodes: []nodeView{gpuNode("a", gpuv1alpha1.ValidationRequired, "", outside), gpuNode("b", "", old)}},
		{name: "a draining node the driver no longer selects leaves", policy: one, want: "leave a", more: true,
			nodes: []nodeView{gpuNode("a", gpuv1alpha1.DrainRequired, old, outside)}},
		{name: "a failed node the driver no longer selects leaves and does not pause", policy: failures(1), want: "leave a, start b", more: true,
			nodes: []nodeView{gpuNode("a", failed, old, failedOn(wanted), outside), gpuNode("b", "", old)}},
		{name: "a foreign node the driver no longer selects is left alone", policy: one,
			nodes: []nodeView{gpuNode("a", gpuv1alpha1.DrainRequired, old, foreign, outside)}},

		{name: "bad selector starts nothing", nodes: []nodeView{gpuNode("a", gpuv1alpha1.DrainRequired, old), gpuNode("b", "", old)},
			policy: gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](2), Drain: &gpuv1alpha1.DrainSpec{PodSelector: "x in ("}},
			want:   "a", more: true, err: "not starting driver upgrades: drain.podSelector"},
		{name: "bad selector, nothing to start", nodes: []nodeView{gpuNode("a", gpuv1alpha1.DrainRequired, old)},
			policy: gpuv1alpha1.DriverUpgradePolicy{WaitForCompletion: &gpuv1alpha1.WaitForCompletionSpec{PodSelector: "x in ("}},
			want:   "a", more: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pl := plan(tt.nodes, tt.policy, policy, tt.resume)
			err := pl.invalid
			errOK := (err == nil && tt.err == "") || (err != nil && tt.err != "" && strings.Contains(err.Error(), tt.err))
			if got := showWork(pl.todo); got != tt.want || pl.more != tt.more || !errOK || pl.summary.paused != tt.paused ||
				strings.Join(pl.acknowledge, ",") != tt.ack || pl.resumed != tt.resume || pl.awaitsReady != tt.recheck {
				t.Errorf("plan = %q, more %v, err %v, paused %v, ack %v, lost %v; want %q, %v, %q, %v, %q, %v",
					got, pl.more, err, pl.summary.paused, pl.acknowledge, pl.awaitsReady, tt.want, tt.more, tt.err, tt.paused, tt.ack, tt.recheck)
			}
		})
	}
}

// A policy the API server would now reject (stored before its rule) starts
// no node, and says which field is wrong.
func TestPlanRefusesInvalidPolicies(t *testing.T) {
	nodes := []nodeView{gpuNode("a", "", "old"), gpuNode("b", "", "old")}
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
		pl := plan(nodes, tt.p, policy, false)
		if len(pl.todo) != 0 || pl.invalid == nil || !strings.Contains(pl.invalid.Error(), "not starting driver upgrades: "+tt.err) {
			t.Errorf("%s: plan = %q, %v; want nothing started and an error naming %s", name, showWork(pl.todo), pl.invalid, tt.err)
		}
	}
}

// The DriverUpgrade condition says how far the rollout is and names the
// failed, blocked and ignored nodes.
func TestCondition(t *testing.T) {
	one := gpuv1alpha1.DriverUpgradePolicy{MaxParallelUpgrades: ptr.To[int32](1)}
	nodes := []nodeView{
		gpuNode("a", gpuv1alpha1.DrainRequired, "old", foreign), gpuNode("b", gpuv1alpha1.UpgradeRequired, "old", foreign),
		gpuNode("c", "Upgrade-Done", "old"), gpuNode("d", gpuv1alpha1.PodDeletionRequired, "old", ann(gpuv1alpha1.AnnotationBlocked, "evicting x/y: forbidden")),
		gpuNode("e", "", wanted), gpuNode("f", gpuv1alpha1.UpgradeFailed, "old", ann(gpuv1alpha1.AnnotationFailedTemplate, wanted)), gpuNode("g", "", "old"),
	}
	st, reason, msg := condition(plan(nodes, one, policy, false).summary, nil)
	want := "paused: maxFailures reached, no node starts until a new driver version or the annotation gpu.loom.dev/driver-upgrade-resume on the ClusterPolicy; " +
		"1 of 7 GPU nodes run the wanted driver; 1 upgrading; 1 waiting; failed (1): f (see annotation gpu.loom.dev/driver-upgrade-failure); " +
		"blocked (1): d (evicting x/y: forbidden); ignored: 3 nodes carry nvidia.com/gpu-driver-upgrade-state without Loom's claim " +
		"(gpu.loom.dev/driver-upgrade-claim) or with a value Loom does not know: a, b, c (unknown state \"Upgrade-Done\")"
	if st != metav1.ConditionFalse || reason != gpuv1alpha1.ReasonUpgradePaused || msg != want {
		t.Errorf("condition = %s %s %q\nwant False UpgradePaused %q", st, reason, msg, want)
	}
	st, reason, msg = condition(plan([]nodeView{gpuNode("e", "", wanted)}, one, policy, false).summary, nil)
	if st != metav1.ConditionTrue || reason != gpuv1alpha1.ReasonUpgradeUpToDate || msg != "1 of 1 GPU nodes run the wanted driver" {
		t.Errorf("up to date: %s %s %q", st, reason, msg)
	}
	// A first install: the DaemonSet is still placing the driver pods; no
	// node needs an upgrade, and the message does not read "0 of 3".
	placing := []nodeView{gpuNode("e", "", wanted), gpuNode("h", "", ""), gpuNode("i", "", wanted+" starting")}
	st, reason, msg = condition(plan(placing, one, policy, false).summary, nil)
	if want := "2 of 3 GPU nodes run the wanted driver; 1 waiting for the DaemonSet to place their driver pod (no upgrade needed)"; st != metav1.ConditionTrue || reason != gpuv1alpha1.ReasonUpgradeUpToDate || msg != want {
		t.Errorf("placing: %s %s %q, want True UpToDate %q", st, reason, msg, want)
	}
	// autoUpgrade off with a new version: the nodes on the older driver are
	// not up to date (kubectl wait --for=condition=DriverUpgrade, kstatus
	// tools), and the pass watches the DaemonSet so that a driver pod a
	// person deletes is counted when its replacement comes.
	manual := gpuv1alpha1.DriverUpgradePolicy{AutoUpgrade: ptr.To(false)}
	pl := plan([]nodeView{gpuNode("a", "", "old"), gpuNode("b", "", wanted), gpuNode("c", "", "old")}, manual, policy, false)
	st, reason, msg = condition(pl.summary, nil)
	if want := "autoUpgrade is false: 2 GPU nodes run an older driver until their driver pod is deleted (or autoUpgrade is set): a, c; " +
		"1 of 3 GPU nodes run the wanted driver"; st != metav1.ConditionFalse || reason != gpuv1alpha1.ReasonAutoUpgradeDisabled || msg != want {
		t.Errorf("autoUpgrade off: %s %s %q\nwant False %s %q", st, reason, msg, gpuv1alpha1.ReasonAutoUpgradeDisabled, want)
	}
	if !pl.summary.awaitsDriverPods() {
		t.Error("autoUpgrade off with outdated nodes: the pass does not follow the DaemonSet's pods")
	}
	// A failed node finishes once it runs the wanted driver (a person
	// deleted its driver pod): the pass follows the DaemonSet's pods too.
	if !plan([]nodeView{gpuNode("a", gpuv1alpha1.UpgradeFailed, "old", ann(gpuv1alpha1.AnnotationFailedTemplate, wanted)), gpuNode("b", "", wanted)},
		one, policy, false).summary.awaitsDriverPods() {
		t.Error("a failed node: the pass does not follow the DaemonSet's pods")
	}
	st, reason, _ = condition(plan([]nodeView{gpuNode("b", "", wanted)}, manual, policy, false).summary, nil)
	if st != metav1.ConditionTrue || reason != gpuv1alpha1.ReasonUpgradeUpToDate {
		t.Errorf("autoUpgrade off, all current: %s %s, want True UpToDate", st, reason)
	}
	// An upgrading node NotReady waits for its kubelet, and says so.
	st, reason, msg = condition(plan([]nodeView{gpuNode("a", gpuv1alpha1.DrainRequired, "old", notReady), gpuNode("b", "", wanted)}, one, policy, false).summary, nil)
	if want := "1 of 2 GPU nodes run the wanted driver; 1 upgrading; 1 upgrading nodes are NotReady and wait for their kubelet " +
		"(no phase timeout fails them; it counts again from when they are Ready; NotReady for more than 10m0s, a node fails and frees its slot): a"; st != metav1.ConditionFalse || reason != gpuv1alpha1.ReasonUpgradeInProgress || msg != want {
		t.Errorf("NotReady: %s %s %q\nwant False InProgress %q", st, reason, msg, want)
	}
	// A node lost mid-upgrade is a failure, named as lost.
	lost := ann(gpuv1alpha1.AnnotationFailedNotReady, "true")
	_, reason, msg = condition(plan([]nodeView{gpuNode("a", gpuv1alpha1.UpgradeFailed, "old", notReady, lost, cordoned,
		ann(gpuv1alpha1.AnnotationFailedTemplate, wanted), ann(gpuv1alpha1.AnnotationFailure, "node a was NotReady for 10m1s")), gpuNode("b", "", wanted)}, one, policy, false).summary, nil)
	if want := "1 failed nodes were NotReady for more than 10m0s (their slots are free; each retries once Ready): a; a: node a was NotReady for 10m1s"; reason != gpuv1alpha1.ReasonUpgradePaused || !strings.Contains(msg, want) {
		t.Errorf("lost: %s %q\nwant UpgradePaused containing %q", reason, msg, want)
	}
	var many []string
	for i := range 25 {
		many = append(many, fmt.Sprint(i))
	}
	if got := names(many); !strings.HasSuffix(got, "9 and 15 more") {
		t.Errorf("names = %q", got)
	}
}
