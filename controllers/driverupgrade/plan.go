package driverupgrade

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
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
// upgraded, or failed on another template) as UpgradeBudget allows. more
// says a later pass has work left.
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
			todo = append(todo, work{node: n.Name})
		}
	}
	start := min(UpgradeBudget(p, len(nodes), len(todo), failed), len(candidates))
	if len(candidates) > 0 {
		if err := validSelectors(p); err != nil {
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
func UpgradeBudget(p gpuv1alpha1.DriverUpgradePolicy, gpuNodes, inProgress, failed int) int {
	budget := gpuNodes - inProgress
	if n := p.Parallel(); n > 0 {
		budget = min(budget, int(n)-inProgress)
	}
	if p.MaxUnavailable != nil {
		u, err := intstr.GetScaledValueFromIntOrPercent(p.MaxUnavailable, gpuNodes, true)
		if err == nil {
			budget = min(budget, max(u, 1)-inProgress-failed)
		}
	}
	return max(budget, 0)
}

// validSelectors checks the policy's pod selectors before any node starts.
func validSelectors(p gpuv1alpha1.DriverUpgradePolicy) error {
	if w := p.WaitForCompletion; w != nil && w.PodSelector != "" {
		if _, err := labels.Parse(w.PodSelector); err != nil {
			return fmt.Errorf("waitForCompletion.podSelector %q: %w", w.PodSelector, err)
		}
	}
	if d := p.Drain; d != nil && d.PodSelector != "" {
		if _, err := labels.Parse(d.PodSelector); err != nil {
			return fmt.Errorf("drain.podSelector %q: %w", d.PodSelector, err)
		}
	}
	return nil
}
