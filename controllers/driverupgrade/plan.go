package driverupgrade

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// work is one node a pass advances: start says the budget lets it begin
// (or retry) its upgrade.
type work struct {
	node  string
	start bool
}

// plan picks the nodes a pass advances, a pure function of the GPU nodes
// (sorted by name), their driver pods by node, the policy and the wanted
// driver template: every node in progress, every failed node whose wanted
// driver runs ready after all, and as many outdated nodes (done, never
// upgraded, or failed on another template) as UpgradeBudget allows. A node
// in a state Loom does not know (a label set by hand) is left alone and
// counts as unavailable, like a failed one. A policy Validate rejects
// starts nothing (the error says why). more says a later pass has work
// left.
func plan(nodes []metav1.PartialObjectMetadata, drivers map[string]*corev1.Pod, p gpuv1alpha1.DriverUpgradePolicy, template string) (todo []work, more bool, err error) {
	var candidates []string
	failed := 0
	for _, n := range nodes {
		pod := drivers[n.Name]
		outdated := pod != nil && pod.Annotations[gpuv1alpha1.AnnotationTemplateHash] != template
		switch n.Labels[gpuv1alpha1.LabelUpgradeState] {
		case "", gpuv1alpha1.UpgradeDone:
			if outdated && p.AutoUpgradeEnabled() {
				candidates = append(candidates, n.Name)
			}
		case gpuv1alpha1.UpgradeFailed:
			// A failed node waits for a new driver version (or a person).
			// It stays cordoned, so it counts against maxUnavailable.
			failed++
			switch {
			case outdated && p.AutoUpgradeEnabled() && n.Annotations[gpuv1alpha1.AnnotationFailedTemplate] != template:
				candidates = append(candidates, n.Name)
			case runsWanted(pod, template):
				todo = append(todo, work{node: n.Name})
			}
		default:
			if !gpuv1alpha1.KnownUpgradeState(n.Labels[gpuv1alpha1.LabelUpgradeState]) {
				failed++ // perhaps cordoned; never advanced nor started
				continue
			}
			todo = append(todo, work{node: n.Name})
		}
	}
	start := min(UpgradeBudget(p, len(nodes), len(todo), failed), len(candidates))
	if len(candidates) > 0 {
		if err := validPolicy(p); err != nil {
			// Starting would cordon node after node only to fail each one.
			return nil, false, fmt.Errorf("not starting driver upgrades: %w", err)
		}
	}
	for _, name := range candidates[:start] {
		todo = append(todo, work{node: name, start: true})
	}
	return todo, len(todo) > 0 || len(candidates) > start, nil
}

// UpgradeBudget is how many nodes may start upgrading now: maxParallelUpgrades
// (0 = unlimited) minus those in progress, and maxUnavailable (a count, or a
// percentage of the GPU nodes rounded up, at least 1) minus those in progress
// and those failed (they stay cordoned): failures cannot cordon the fleet.
// Values the API server rejects (a negative parallel count, a maxUnavailable
// that is no count or percentage) count as 1.
func UpgradeBudget(p gpuv1alpha1.DriverUpgradePolicy, gpuNodes, inProgress, failed int) int {
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
		budget = min(budget, max(u, 1)-inProgress-failed)
	}
	return max(budget, 0)
}

// validPolicy checks the policy (its pod selectors, budget and timeouts)
// before any node starts.
func validPolicy(p gpuv1alpha1.DriverUpgradePolicy) error {
	return p.Validate(nil).ToAggregate()
}
