package driverupgrade

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
)

// nodeView is one node of the driver upgrade's set as a pass observed it.
type nodeView struct {
	node *corev1.Node
	// driver is the node's driver pod (nil: none).
	driver *corev1.Pod
	// target is the pod template hash of the driver DaemonSet that owns
	// the driver pod ("" when there is none, or it is not the policy's).
	target string
	// unplaced: none of the policy's driver DaemonSets would place a
	// driver pod on the node now (driverPlaces), whether or not one runs
	// there: a new driver can never come to it.
	unplaced bool
}

// template is the driver template the node's upgrade aims at: its
// DaemonSet's, or without one the template its upgrade began for.
func (v nodeView) template() string {
	if v.target != "" {
		return v.target
	}
	return v.node.Annotations[gpuv1alpha1.AnnotationTarget]
}

// work is one node a pass advances: start says the budget lets it begin
// (or retry) its upgrade; leave that it left its driver DaemonSets'
// placement, and Loom lets go of it.
type work struct {
	node  string
	start bool
	leave bool
}

// planned is what plan decides for a pass.
type planned struct {
	todo []work
	// more says a later pass has work left.
	more bool
	// awaitsReady says a failed node to retry (lost, or on a new
	// template) is NotReady, or a failed node's new driver pod is not
	// ready: a pass now and then sees either Ready (no watch does: the
	// node watch reads metadata only, and pods are not watched).
	awaitsReady bool
	// invalid says why no node starts: the policy is one the API server
	// would now reject.
	invalid error
	// acknowledge are the failed nodes a resume lets the rollout go past;
	// resumed says the resume annotation was acted on (and is removed).
	acknowledge []string
	resumed     bool
	summary     summary
}

// kind sorts a node of the set for the planner.
type kind int

const (
	// idle: not in an upgrade (never upgraded, or upgrade-done).
	idle kind = iota
	// upgrading: claimed, in one of the steps.
	upgrading
	// failed: claimed, upgrade-failed.
	failed
	// ignored: a state Loom does not step (another's, or unknown).
	ignored
)

// classify sorts a node: a state label without the policy's claim, or a
// value Loom does not know, is ignored (a foreign upgrade-done is idle:
// nothing is in flight on it). A claimed node whose label a person removed
// counts as upgrading until the pass lets go of it.
func classify(n *corev1.Node, claim string) (kind, string) {
	state := n.Labels[gpuv1alpha1.LabelUpgradeState]
	mine := n.Annotations[gpuv1alpha1.AnnotationClaim] == claim
	switch {
	case !gpuv1alpha1.KnownUpgradeState(state):
		return ignored, fmt.Sprintf("%s (unknown state %q)", n.Name, state)
	case state == gpuv1alpha1.UpgradeDone || (state == "" && !mine):
		return idle, ""
	case !mine:
		return ignored, n.Name
	case state == "":
		return upgrading, ""
	case state == gpuv1alpha1.UpgradeFailed:
		return failed, ""
	}
	return upgrading, ""
}

// plan picks the nodes a pass advances, a pure function of the node set
// (sorted by name), the policy, its name (the claim) and whether the
// policy carries the resume annotation: every node Loom claimed and is
// upgrading, every failed one whose wanted driver runs ready after all,
// and as many outdated nodes (idle, or failed on another template) and
// nodes lost mid-upgrade (failed ones once Ready) as UpgradeBudget allows,
// unless maxFailures paused the rollout; a node already unavailable (a
// failed one still cordoned) is not held back by maxUnavailable, which it
// does not move. Ignored nodes are neither advanced nor started. A node no driver DaemonSet would
// place a driver pod on (unplaced) is never started, and a claimed one,
// upgrading or failed, leaves its upgrade instead of failing in it or
// counting towards maxFailures: the new driver can never come to it. A
// policy Validate rejects starts nothing (invalid says why).
func plan(nodes []nodeView, p gpuv1alpha1.DriverUpgradePolicy, claim string, resume bool) planned {
	var out planned
	var candidates, failures []string
	// down: failed nodes still cordoned: retrying one makes no further node
	// unavailable. (A node NotReady or cordoned by someone else is not
	// started before the budget allows: it would likely fail.)
	down := map[string]bool{}
	inProgress, unavailable := 0, 0
	for _, v := range nodes {
		k, why := classify(v.node, claim)
		out.summary.add(v, k, why)
		if k == upgrading {
			inProgress++
		}
		if k == upgrading || !available(v.node) {
			unavailable++
		}
		tmpl := v.template()
		outdated := v.driver != nil && v.target != "" && v.driver.Annotations[gpuv1alpha1.AnnotationTemplateHash] != v.target
		down[v.node.Name] = k == failed && v.node.Spec.Unschedulable
		switch {
		case v.unplaced && (k == upgrading || k == failed):
			out.todo = append(out.todo, work{node: v.node.Name, leave: true})
		case v.unplaced:
		case k == idle:
			switch {
			case outdated && p.AutoUpgradeEnabled():
				candidates = append(candidates, v.node.Name)
			case outdated:
				out.summary.manual = append(out.summary.manual, v.node.Name)
			}
		case k == upgrading:
			out.todo = append(out.todo, work{node: v.node.Name})
		case k == failed:
			candidate, failure := planFailed(v, p, tmpl, outdated, &out)
			if candidate {
				candidates = append(candidates, v.node.Name)
			}
			if failure {
				failures = append(failures, v.node.Name)
			}
		}
	}
	if resume && len(failures) > 0 {
		out.acknowledge, failures = failures, nil
	}
	out.resumed = resume
	out.summary.paused = paused(p, len(failures))
	both := UpgradeBudget(p, len(nodes), inProgress, unavailable)
	parallelOnly := p
	parallelOnly.MaxUnavailable = nil
	parallel := UpgradeBudget(parallelOnly, len(nodes), inProgress, unavailable)
	switch {
	case out.summary.paused:
		parallel = 0
	case len(candidates) > 0:
		if err := validPolicy(p); err != nil {
			// Starting would cordon node after node only to fail each one.
			out.invalid = fmt.Errorf("not starting driver upgrades: %w", err)
			parallel = 0
		}
	}
	started := starting(candidates, down, parallel, both)
	for _, name := range started {
		out.todo = append(out.todo, work{node: name, start: true})
	}
	start := len(started)
	out.summary.waiting, out.summary.inProgress = len(candidates)-start, out.summary.inProgress+start
	out.more = len(out.todo) > 0 || len(candidates) > start
	return out
}

// planFailed plans a failed node: advanced when its wanted driver runs
// ready after all, a candidate to retry (on a new template, or when it was
// lost and is Ready again), or awaited. failure: it counts towards
// maxFailures (failed on the current template, not acknowledged, not a
// lost node back).
func planFailed(v nodeView, p gpuv1alpha1.DriverUpgradePolicy, tmpl string, outdated bool, out *planned) (candidate, failure bool) {
	failedOn := v.node.Annotations[gpuv1alpha1.AnnotationFailedTemplate]
	// A failed node retries on a new template, and a node lost (NotReady
	// too long) on its own: its failure was its kubelet's, not yet the
	// driver's. Either only once Ready: an upgrade started without a
	// kubelet would hold its slot until lost again.
	lost := v.node.Annotations[gpuv1alpha1.AnnotationFailedNotReady] != ""
	retry := p.AutoUpgradeEnabled() && (lost || outdated && failedOn != tmpl)
	back := lost && retry && inventory.NodeReady(v.node)
	switch {
	case runsWanted(v.driver, tmpl):
		out.todo = append(out.todo, work{node: v.node.Name})
	case retry && !inventory.NodeReady(v.node):
		out.awaitsReady = true
	case retry:
		candidate = true
	case v.driver != nil && v.driver.Annotations[gpuv1alpha1.AnnotationTemplateHash] == tmpl:
		// Its new driver may yet be ready (a crash loop ends, the image is
		// pushed): the node then finishes.
		out.awaitsReady = true
	}
	return candidate, failedOn == tmpl && v.node.Annotations[gpuv1alpha1.AnnotationFailureAcknowledged] == "" && !back
}

// starting picks the candidates to start within parallel slots and both
// budgets (parallel and maxUnavailable). A node that is available now takes
// from both; one already down (a failed node still cordoned) only a
// parallel slot, and goes first: it costs no availability, and its upgrade
// may bring it back.
func starting(candidates []string, down map[string]bool, parallel, both int) []string {
	order := slices.Clone(candidates)
	slices.SortStableFunc(order, func(a, b string) int {
		switch {
		case down[a] == down[b]:
			return 0
		case down[a]:
			return -1
		}
		return 1
	})
	var out []string
	for _, name := range order {
		if len(out) == parallel {
			break
		}
		if !down[name] {
			if both == 0 {
				continue
			}
			both--
		}
		out = append(out, name)
	}
	return out
}

// paused reports whether failures (nodes failed on the template they are
// being upgraded to, not acknowledged by a resume) reach maxFailures
// (default 1; 0 never pauses; a negative value, which the API server
// rejects, counts as 1).
func paused(p gpuv1alpha1.DriverUpgradePolicy, failures int) bool {
	limit := 1
	if p.MaxFailures != nil {
		limit = int(*p.MaxFailures)
		if limit < 0 {
			limit = 1
		}
	}
	return limit > 0 && failures >= limit
}

// available reports whether a node can run work: Ready and schedulable.
func available(n *corev1.Node) bool {
	return !n.Spec.Unschedulable && inventory.NodeReady(n)
}

// UpgradeBudget is how many nodes may start upgrading now: maxParallelUpgrades
// (0 = unlimited) minus those in progress, and maxUnavailable (a count, or a
// percentage of the GPU nodes rounded up, at least 1) minus the GPU nodes
// unavailable: every one NotReady or unschedulable, Loom's or not, and every
// one upgrading. Values the API server rejects (a negative parallel count, a
// maxUnavailable that is no count or percentage) count as 1.
func UpgradeBudget(p gpuv1alpha1.DriverUpgradePolicy, gpuNodes, inProgress, unavailable int) int {
	budget := gpuNodes - inProgress
	switch n := p.Parallel(); {
	case n > 0:
		budget = min(budget, int(n)-inProgress)
	case n < 0:
		budget = min(budget, 1-inProgress)
	}
	if p.MaxUnavailable != nil {
		u, err := intstr.GetScaledValueFromIntOrPercent(p.MaxUnavailable, gpuNodes, true)
		if err != nil {
			u = 1
		}
		budget = min(budget, max(u, 1)-unavailable)
	}
	return max(budget, 0)
}

// validPolicy checks the policy (its pod selectors, budget and timeouts)
// before any node starts.
func validPolicy(p gpuv1alpha1.DriverUpgradePolicy) error {
	return p.Validate(nil).ToAggregate()
}
