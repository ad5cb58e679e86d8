package driverupgrade

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// The state machine knows exactly the vocabulary's states.
func TestStepsAreTheKnownStates(t *testing.T) {
	want := append([]string{""}, gpuv1alpha1.UpgradeStates...)
	got := slices.Collect(maps.Keys(steps))
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("steps %v, states %v", got, want)
	}
}

// fuzzStates are the states a fuzzed byte picks from: every known one and
// some garbage.
var fuzzStates = append(append([]string{""}, gpuv1alpha1.UpgradeStates...), "something-else", "Upgrade-Done", " ")

// fuzzPods turns bytes into pods on the node, one per two bytes: phase,
// owner, GPUs, labels, emptyDir, terminating, mirror, Loom's operand.
func fuzzPods(b []byte, label string, now time.Time) []corev1.Pod {
	var pods []corev1.Pod
	for i := 0; i+1 < len(b) && len(pods) < 16; i += 2 {
		x, y := b[i], b[i+1]
		p := pod(fmt.Sprintf("p%d", i/2))
		p.Status.Phase = []corev1.PodPhase{corev1.PodRunning, corev1.PodPending, corev1.PodSucceeded, corev1.PodFailed, ""}[int(x)%5]
		switch (x >> 3) & 3 {
		case 1:
			bare(&p)
		case 2:
			daemon(&p)
		}
		if x&0x20 != 0 {
			gpus(&p)
		}
		if x&0x40 != 0 {
			p.Labels[label] = "yes"
		}
		if x&0x80 != 0 {
			emptyDir(&p)
		}
		if y&1 != 0 {
			p.DeletionTimestamp = ptr.To(metav1.NewTime(now))
		}
		if y&2 != 0 {
			mirror(&p)
		}
		if y&4 != 0 {
			operand(&p)
		}
		if y&8 != 0 {
			p.Labels["job"] = "batch"
		}
		pods = append(pods, p)
	}
	return pods
}

// FuzzNext: for any node (state label and annotations of any value, any
// timestamps), driver pod, pods, policy and clock, next does not panic,
// moves the node to a known state or leaves it where it is (a node in an
// unknown state is not touched at all), sets the state exactly when it
// changes it, never uncordons a node Loom did not cordon, evicts only
// evictable pods it was given, deletes only the driver pod, and leaves its
// input alone. The same input as a fleet: plan never starts more nodes than
// maxParallelUpgrades and maxUnavailable allow.
func FuzzNext(f *testing.F) {
	f.Add(uint8(3), true, "true", t0.Format(time.RFC3339), t0.Format(time.RFC3339), "", "", []byte{0x20, 0, 0x61, 8},
		"job=batch", "drain=yes", int32(60), int32(300), int32(60), uint8(0xff), "old-template", true, int64(90), []byte{1, 2, 3}, int32(1), "25%")
	f.Add(uint8(7), false, "", "x", "not a time", "why", wanted, []byte{}, "job in (", "drain in (", int32(-1), int32(0), int32(-5),
		uint8(0), wanted, false, int64(-1<<62), []byte{7, 7, 9, 0}, int32(0), "0%")
	f.Add(uint8(9), true, "no", "", "9999-12-31T23:59:59Z", "", "older", []byte{0xff, 0xff}, "", "", int32(1<<31-1), int32(1<<31-1),
		int32(1<<31-1), uint8(0x0f), "", true, int64(1<<62), []byte{8, 8, 8}, int32(-3), "half")
	f.Add(uint8(10), true, "true", t0.Format(time.RFC3339), "", "", "", []byte{0x45, 0x0c}, "!job", "", int32(0), int32(0), int32(0),
		uint8(0x30), "new-template", true, int64(0), []byte{0, 9, 10, 11, 1}, int32(2), "")
	f.Fuzz(func(t *testing.T, state uint8, unschedulable bool, wasCordoned, started, phase, failure, failedTemplate string, podBytes []byte,
		waitSel, drainSel string, waitTimeout, deleteTimeout, drainTimeout int32, flags uint8, driverTemplate string, driverReady bool,
		elapsed int64, fleet []byte, parallel int32, unavailable string) {
		now := t0.Add(time.Duration(elapsed))
		n := node(fuzzStates[int(state)%len(fuzzStates)], unschedulable)
		switch len(podBytes) % 4 {
		case 1: // a foreign label
			delete(n.Annotations, gpuv1alpha1.AnnotationClaim)
		case 2: // a cordon someone else wrote
			cordonedBy("kubectl")(n)
		case 3: // a claim without a label
			n.Annotations[gpuv1alpha1.AnnotationClaim] = policy
		}
		delete(n.Annotations, gpuv1alpha1.AnnotationPhaseStarted)
		for k, v := range map[string]string{gpuv1alpha1.AnnotationWasCordoned: wasCordoned, gpuv1alpha1.AnnotationUpgradeStarted: started,
			gpuv1alpha1.AnnotationPhaseStarted: phase, gpuv1alpha1.AnnotationFailure: failure, gpuv1alpha1.AnnotationFailedTemplate: failedTemplate} {
			if v != "" || flags&0x40 != 0 { // present, possibly empty
				n.Annotations[k] = v
			}
		}
		var driver *corev1.Pod
		if flags&0x80 == 0 {
			driver = driverPod(driverTemplate, driverReady)
		}
		p := gpuv1alpha1.DriverUpgradePolicy{
			WaitForCompletion: &gpuv1alpha1.WaitForCompletionSpec{PodSelector: waitSel, TimeoutSeconds: waitTimeout},
			PodDeletion:       &gpuv1alpha1.PodDeletionSpec{Force: flags&1 != 0, DeleteEmptyDir: flags&2 != 0, TimeoutSeconds: deleteTimeout},
			Drain:             &gpuv1alpha1.DrainSpec{Enable: flags&4 != 0, Force: flags&8 != 0, DeleteEmptyDir: flags&16 != 0, PodSelector: drainSel, TimeoutSeconds: drainTimeout},
			AutoUpgrade:       ptr.To(flags&32 == 0),
		}
		pods := fuzzPods(podBytes, "drain", now)
		checkNext(t, n, driver, pods, target{policy: p, claim: policy, template: wanted, namespace: loomNS, start: flags&0x20 != 0, release: elapsed%7 == 0}, now)

		p.MaxParallelUpgrades = &parallel
		if u := intstr.Parse(unavailable); unavailable != "" {
			p.MaxUnavailable = &u
		}
		checkPlan(t, fleet, p)
	})
}

// checkNext holds next's invariants.
func checkNext(t *testing.T, n *corev1.Node, driver *corev1.Pod, pods []corev1.Pod, tg target, now time.Time) {
	t.Helper()
	before, podsBefore := n.DeepCopy(), fmt.Sprint(pods)
	from := n.Labels[gpuv1alpha1.LabelUpgradeState]
	state, acts := next(n, driver, pods, tg, now)
	if !equalNodes(before, n) || fmt.Sprint(pods) != podsBefore {
		t.Fatal("next changed its input")
	}
	claimed := n.Annotations[gpuv1alpha1.AnnotationClaim] == policy
	if !gpuv1alpha1.KnownUpgradeState(from) && (state != from || (len(acts) != 0 && !tg.release)) {
		t.Fatalf("a node in unknown state %q: moved to %q with %v", from, state, show(acts, now))
	}
	if !claimed && from != "" && from != gpuv1alpha1.UpgradeDone && (state != from || len(acts) != 0) {
		t.Fatalf("a node in state %q without Loom's claim: moved to %q with %v", from, state, show(acts, now))
	}
	if tg.release && (len(acts) != 0) != claimed {
		t.Fatalf("release of a node (claimed %v): %v", claimed, show(acts, now))
	}
	if v, ok := n.Annotations[gpuv1alpha1.AnnotationPhaseStarted]; ok && claimed && inFlight(from) && !tg.release && state != from {
		if at, err := time.Parse(time.RFC3339, v); err != nil || at.After(now.Add(clockSkew)) {
			t.Fatalf("a node whose phase-started %q is unusable moved from %q to %q: %v", v, from, state, show(acts, now))
		}
	}
	if !gpuv1alpha1.KnownUpgradeState(state) && state != from {
		t.Fatalf("moved to unknown state %q", state)
	}
	var sets, cordons, uncordons int
	for i, a := range acts {
		switch a.kind {
		case setState:
			sets++
			if a.state != state || i != len(acts)-1 {
				t.Fatalf("state %q, but actions %v", state, show(acts, now))
			}
			for k := range a.annotations {
				if !strings.HasPrefix(k, "gpu.loom.dev/driver-upgrade-") {
					t.Fatalf("sets annotation %s", k)
				}
			}
		case cordon:
			cordons++
			if a := acts[len(acts)-1]; a.kind != setState || a.annotations[gpuv1alpha1.AnnotationClaim] == nil || n.Spec.Unschedulable {
				t.Fatalf("cordons without the claim in the same patch, or a cordoned node: %v", show(acts, now))
			}
		case uncordon:
			uncordons++
			_, was := n.Annotations[gpuv1alpha1.AnnotationWasCordoned]
			_, began := n.Annotations[gpuv1alpha1.AnnotationUpgradeStarted]
			if was || !began || !claimed || !n.Spec.Unschedulable || (len(n.ManagedFields) > 0 && !gpuv1alpha1.ManagesUnschedulable(n.ManagedFields, FieldOwner)) {
				t.Fatalf("uncordons a node Loom did not cordon: %v", n.Annotations)
			}
		case evict:
			for _, p := range a.pods {
				checkEvictable(t, p, pods, tg)
			}
		case deleteDriver:
			if len(a.pods) != 1 || a.pods[0] != driver {
				t.Fatalf("deletes %v, not the driver pod", a.pods)
			}
		}
	}
	if (state != from && sets != 1) || sets > 1 || cordons+uncordons > 1 {
		t.Fatalf("%q -> %q with actions %v", from, state, show(acts, now))
	}
}

// checkEvictable: an evicted pod is one of the node's, running, not
// terminating, not a DaemonSet's, mirror or Loom operand pod.
func checkEvictable(t *testing.T, p *corev1.Pod, pods []corev1.Pod, tg target) {
	t.Helper()
	if !slices.ContainsFunc(pods, func(q corev1.Pod) bool { return q.Namespace == p.Namespace && q.Name == p.Name }) {
		t.Fatalf("evicts %s, not a pod on the node", p.Name)
	}
	_, mirrored := p.Annotations[corev1.MirrorPodAnnotationKey]
	c := metav1.GetControllerOf(p)
	if p.DeletionTimestamp != nil || mirrored || (c != nil && c.Kind == "DaemonSet") || p.Status.Phase == corev1.PodSucceeded ||
		p.Status.Phase == corev1.PodFailed || (p.Namespace == tg.namespace && p.Labels["app.kubernetes.io/managed-by"] == "loom") {
		t.Fatalf("evicts %s/%s, which is not evictable: %+v", p.Namespace, p.Name, p)
	}
}

// checkPlan builds a fleet from bytes (per node: its state, whether its
// driver is outdated, ready, missing, and whether it failed on the wanted
// template; by position, whether it carries the claim, is cordoned by
// someone else or NotReady) and holds plan to the budget.
func checkPlan(t *testing.T, fleet []byte, p gpuv1alpha1.DriverUpgradePolicy) {
	t.Helper()
	var nodes []nodeView
	inProgress, unavailable := 0, 0
	for i, b := range fleet {
		if i == 64 {
			break
		}
		state := fuzzStates[int(b&0x0f)%len(fuzzStates)]
		v := nodeView{node: readyNode(fmt.Sprintf("n%02d", i), state)}
		if b&0x10 != 0 {
			v.node.Annotations[gpuv1alpha1.AnnotationFailedTemplate] = wanted
		}
		if i%5 == 4 {
			delete(v.node.Annotations, gpuv1alpha1.AnnotationClaim)
		}
		v.node.Spec.Unschedulable = i%7 == 3
		if i%11 == 5 {
			v.node.Status.Conditions = nil
		}
		if b&0x20 == 0 {
			tmpl := wanted
			if b&0x40 != 0 {
				tmpl = "old-template"
			}
			v.driver, v.target = driverPod(tmpl, b&0x80 != 0), wanted
		}
		k, _ := classify(v.node, policy)
		if k == upgrading {
			inProgress++
		}
		if k == upgrading || !available(v.node) {
			unavailable++
		}
		nodes = append(nodes, v)
	}
	pl := plan(nodes, p, policy, false)
	started, seen := 0, map[string]bool{}
	for _, w := range pl.todo {
		i := slices.IndexFunc(nodes, func(v nodeView) bool { return v.node.Name == w.node })
		if i < 0 || seen[w.node] {
			t.Fatalf("plan advances %s: unknown or twice (%v)", w.node, pl.todo)
		}
		seen[w.node] = true
		if k, _ := classify(nodes[i].node, policy); k == ignored {
			t.Fatalf("plan advances %s, which it ignores (%v)", w.node, nodes[i].node.Labels)
		}
		if w.start {
			started++
			if k, _ := classify(nodes[i].node, policy); k != idle && k != failed {
				t.Fatalf("plan starts %s, already upgrading", w.node)
			}
		}
	}
	if started == 0 {
		return
	}
	if pl.invalid != nil || pl.summary.paused {
		t.Fatalf("plan starts %d nodes with an invalid policy or paused: %v", started, pl.invalid)
	}
	if n := p.Parallel(); n > 0 && inProgress+started > int(n) {
		t.Fatalf("%d upgrading + %d started > maxParallelUpgrades %d", inProgress, started, n)
	}
	limit := 1
	if p.MaxUnavailable != nil {
		if u, err := intstr.GetScaledValueFromIntOrPercent(p.MaxUnavailable, len(nodes), true); err == nil {
			limit = max(u, 1)
		}
	}
	if p.MaxUnavailable != nil && unavailable+started > limit {
		t.Fatalf("%d unavailable + %d started > maxUnavailable %v (%d of %d nodes)", unavailable, started, p.MaxUnavailable, limit, len(nodes))
	}
	if inProgress+started > len(nodes) {
		t.Fatalf("%d upgrading + %d started on %d nodes", inProgress, started, len(nodes))
	}
}
