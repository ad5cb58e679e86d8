package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// upgradeWatch samples the GPU nodes of one test from the API server while
// an upgrade runs and remembers what must never happen: more unavailable
// at once than the budget allows, a node cordoned without Loom's claim
// (other than the one a person cordoned), a person's cordon lifted.
type upgradeWatch struct {
	prefix, userCordoned string
	mu                   sync.Mutex
	maxUnavailable       int
	violations           []string
}

func (w *upgradeWatch) sample(ctx context.Context) error {
	nodes := &corev1.NodeList{}
	if err := cluster.Client.List(ctx, nodes); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	unavailable := 0
	for _, n := range nodes.Items {
		if !strings.HasPrefix(n.Name, w.prefix) {
			continue
		}
		if n.Spec.Unschedulable {
			unavailable++
		}
		switch {
		case n.Name == w.userCordoned && !n.Spec.Unschedulable:
			w.violations = append(w.violations, "the person's cordon on "+n.Name+" was lifted")
		case n.Name != w.userCordoned && n.Spec.Unschedulable && n.Annotations[gpuv1alpha1.AnnotationClaim] == "":
			w.violations = append(w.violations, n.Name+" is cordoned without Loom's claim")
		}
	}
	w.maxUnavailable = max(w.maxUnavailable, unavailable)
	return nil
}

func (w *upgradeWatch) run(ctx context.Context) {
	for ctx.Err() == nil {
		_ = w.sample(ctx)
		time.Sleep(100 * time.Millisecond)
	}
}

// A 10-node driver upgrade (maxUnavailable 3, one node cordoned by a
// person, two carrying GPU Operator's leftover state label) with the
// leader SIGKILLed at random points three times: the upgrade finishes on
// every node Loom may touch, no more than 3 nodes were ever unavailable at
// once (the person's cordon counts), no node was cordoned without Loom's
// claim, the person's node stays cordoned, and the leftovers are left
// alone and named.
func TestChaosDriverUpgradeSIGKILL(t *testing.T) {
	ctx := context.Background()
	const prefix = "chaos-up"
	names := testNodes(t, framework.NodeSpec{Prefix: prefix, Count: 10, GPUs: 8})
	userCordoned, leftovers := names[0], names[8:]
	patchNode(t, userCordoned, `{"spec":{"unschedulable":true}}`)
	for _, n := range leftovers {
		patchNode(t, n, fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, gpuv1alpha1.LabelUpgradeState, gpuv1alpha1.PodRestartRequired))
	}
	rel, m := startLoomManager(t, shortLease...)
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "chaos-upgrade"}}
	cp.Spec.Driver.UpgradePolicy.MaxParallelUpgrades = ptr.To[int32](0)
	cp.Spec.Driver.UpgradePolicy.MaxUnavailable = ptr.To(intstr.FromInt32(3))
	createPolicy(t, cp)
	eventually(t, 2*time.Minute, func() (bool, string) {
		return driverPodsOn(t, names[1:8], "") == 7, fmt.Sprintf("%d of 7 driver pods", driverPodsOn(t, names[1:8], ""))
	})
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	w := &upgradeWatch{prefix: prefix + "-", userCordoned: userCordoned}
	go w.run(wctx)

	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cp.DeepCopy())
	cp.Spec.Driver.Image.Version = "580.65.06"
	if err := cluster.Client.Patch(ctx, cp, patch); err != nil {
		t.Fatal(err)
	}
	holder := leaseHolder(t)
	for i := range 3 {
		time.Sleep(time.Duration(500+rand.IntN(2500)) * time.Millisecond)
		m.Kill()
		t.Logf("SIGKILL %d of the leader mid-upgrade", i+1)
		var err error
		if m, err = cluster.RunManager(ctx, loomBin, rel, shortLease...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Stop(20 * time.Second) })
		// The next kill is of the new leader, once it leads: the dead one's
		// lease runs out first (no release on SIGKILL).
		prev := holder
		eventually(t, 2*time.Minute, func() (bool, string) {
			holder = leaseHolder(t)
			return holder != "" && holder != prev, "lease held by " + holder
		})
	}
	// Loom may upgrade the person's cordoned node too (it stays cordoned);
	// the leftovers are not its to touch.
	upgradable := names[:8]
	eventually(t, 4*time.Minute, func() (bool, string) {
		done := 0
		for _, n := range upgradable {
			if l, _ := nodeLabels(n); l[gpuv1alpha1.LabelUpgradeState] == gpuv1alpha1.UpgradeDone {
				done++
			}
		}
		return done == len(upgradable), fmt.Sprintf("%d of %d nodes upgrade-done", done, len(upgradable))
	})
	stop()
	if err := w.sample(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("at most %d GPU nodes unavailable at once (budget 3, the person's cordon included)", w.maxUnavailable)
	if w.maxUnavailable > 3 {
		t.Errorf("%d nodes unavailable at once, budget 3", w.maxUnavailable)
	}
	if len(w.violations) > 0 {
		t.Errorf("invariants broken: %s", strings.Join(uniq(w.violations), "; "))
	}
	for _, n := range leftovers {
		node := &corev1.Node{}
		if err := cluster.Client.Get(ctx, client.ObjectKey{Name: n}, node); err != nil {
			t.Fatal(err)
		}
		if node.Spec.Unschedulable || node.Labels[gpuv1alpha1.LabelUpgradeState] != gpuv1alpha1.PodRestartRequired || node.Annotations[gpuv1alpha1.AnnotationClaim] != "" {
			t.Errorf("leftover %s was touched: unschedulable %v, labels %v", n, node.Spec.Unschedulable, node.Labels)
		}
	}
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(cp.Status.Conditions, gpuv1alpha1.ConditionDriverUpgrade)
	if c == nil || !strings.Contains(c.Message, leftovers[0]) || !strings.Contains(c.Message, "without Loom's claim") {
		t.Errorf("DriverUpgrade condition does not name the leftovers: %+v", c)
	}
	if n := driverPodsOn(t, names[:8], "580.65.06"); n != 8 {
		t.Errorf("%d of 8 nodes run the new driver", n)
	}
}

// driverPodsOn counts running driver pods on the nodes, of the version
// when one is given.
func driverPodsOn(t *testing.T, nodes []string, version string) int {
	t.Helper()
	pods := &corev1.PodList{}
	if err := cluster.Client.List(context.Background(), pods, client.InNamespace(loomNS),
		client.MatchingLabels{gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, n := range nodes {
		want[n] = true
	}
	count := 0
	for _, p := range pods.Items {
		if want[p.Spec.NodeName] && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning &&
			(version == "" || strings.Contains(p.Spec.Containers[0].Image, version)) {
			count++
		}
	}
	return count
}

func uniq(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// leaseHolder is the manager lease's holder identity.
func leaseHolder(t *testing.T) string {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := cluster.Client.Get(context.Background(), client.ObjectKey{Namespace: loomNS, Name: "loom-manager"}, l); err != nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}
