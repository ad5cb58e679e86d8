package driverupgrade

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/sharing"
)

// t0 is when the node entered its state; each case's clock is t0 plus its
// elapsed time.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	wanted = "new-template"
	loomNS = "loom-system"
	policy = "default"
)

// node is a GPU node in state since t0, Ready since before, with extra
// annotations (short keys: the part after gpu.loom.dev/driver-upgrade-). A
// node in a state carries the policy's claim (ann "claim", "" removes it);
// a cordoned one was cordoned by Loom's field owner (managed fields).
func node(state string, cordoned bool, ann ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-0", Labels: map[string]string{},
		Annotations: map[string]string{gpuv1alpha1.AnnotationPhaseStarted: t0.Format(time.RFC3339)}}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour))}}
	n.Spec.Unschedulable = cordoned
	if state != "" {
		n.Labels[gpuv1alpha1.LabelUpgradeState] = state
		n.Annotations[gpuv1alpha1.AnnotationClaim] = policy
	}
	if cordoned {
		cordonedBy(FieldOwner)(n)
	}
	for i := 0; i+1 < len(ann); i += 2 {
		n.Annotations["gpu.loom.dev/driver-upgrade-"+ann[i]] = ann[i+1]
		if ann[i+1] == "" && ann[i] == "claim" {
			delete(n.Annotations, gpuv1alpha1.AnnotationClaim)
		}
	}
	return n
}

// cordonedBy makes manager the owner of the node's spec.unschedulable.
func cordonedBy(manager string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate,
			FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:unschedulable":{}}}`)}}
	}
}

func with(n *corev1.Node, f func(*corev1.Node)) *corev1.Node { f(n); return n }

// readiness makes the node's Ready condition status since t0 plus since.
func readiness(status corev1.ConditionStatus, since time.Duration) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(t0.Add(since))}}
	}
}

func driverPod(template string, ready bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: "loom-driver-x",
		Annotations: map[string]string{gpuv1alpha1.AnnotationTemplateHash: template}}}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
	return p
}

// pod is a running pod in default named name, controlled by a ReplicaSet,
// changed by opts.
func pod(name string, opts ...func(*corev1.Pod)) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{},
		OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "rs", Controller: ptr.To(true)}}}}
	p.Spec.Containers = []corev1.Container{{Name: "c"}}
	p.Status.Phase = corev1.PodRunning
	for _, o := range opts {
		o(&p)
	}
	return p
}

func gpus(p *corev1.Pod) {
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{inventory.GPUResource: resource.MustParse("8")}
}

// asks gives the pod's container a limit of one of resource name: a MIG
// device or shared replicas use the driver as much as whole GPUs do.
func asks(name corev1.ResourceName) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{name: resource.MustParse("1")}
	}
}
func bare(p *corev1.Pod) { p.OwnerReferences = nil }
func emptyDir(p *corev1.Pod) {
	p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
}
func done(p *corev1.Pod)   { p.Status.Phase = corev1.PodSucceeded }
func daemon(p *corev1.Pod) { p.OwnerReferences[0].Kind = "DaemonSet" }
func mirror(p *corev1.Pod) { p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"} }
func terminating(p *corev1.Pod) {
	p.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
}

// terminatingSince: the pod is being deleted since t0 plus since.
func terminatingSince(since time.Duration) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.DeletionTimestamp = ptr.To(metav1.NewTime(t0.Add(since))) }
}
func labelled(k, v string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Labels[k] = v } }
func operand(p *corev1.Pod) {
	p.Namespace = loomNS
	p.Labels["app.kubernetes.io/managed-by"] = "loom"
}

// show renders actions for comparison: annotation keys short, the phase
// start left out when it is the clock's now.
func show(acts []action, now time.Time) []string {
	var out []string
	for _, a := range acts {
		switch a.kind {
		case cordon:
			out = append(out, "cordon")
		case uncordon:
			out = append(out, "uncordon")
		case evict, deleteDriver:
			var names []string
			for _, p := range a.pods {
				names = append(names, p.Namespace+"/"+p.Name)
			}
			verb := "evict "
			if a.kind == deleteDriver {
				verb = "delete driver "
			}
			out = append(out, verb+strings.Join(names, ","))
		case setState:
			s := []string{}
			for k, v := range a.annotations {
				k = strings.TrimPrefix(k, "gpu.loom.dev/driver-upgrade-")
				switch {
				case v == nil:
					s = append(s, "-"+k)
				case k == "phase-started" && *v == now.Format(time.RFC3339):
				default:
					s = append(s, k+"="+*v)
				}
			}
			slices.Sort(s)
			out = append(out, strings.TrimSpace("state "+a.state+" "+strings.Join(s, " ")))
		}
	}
	return out
}

func TestNext(t *testing.T) {
	none := gpuv1alpha1.DriverUpgradePolicy{}
	waitFor := func(sel string, timeout int32) gpuv1alpha1.DriverUpgradePolicy {
		return gpuv1alpha1.DriverUpgradePolicy{WaitForCompletion: &gpuv1alpha1.WaitForCompletionSpec{PodSelector: sel, TimeoutSeconds: timeout}}
	}
	deletion := func(force, emptyDir bool, timeout int32) gpuv1alpha1.DriverUpgradePolicy {
		return gpuv1alpha1.DriverUpgradePolicy{PodDeletion: &gpuv1alpha1.PodDeletionSpec{Force: force, DeleteEmptyDir: emptyDir, TimeoutSeconds: timeout}}
	}
	drain := func(sel string, timeout int32) gpuv1alpha1.DriverUpgradePolicy {
		return gpuv1alpha1.DriverUpgradePolicy{Drain: &gpuv1alpha1.DrainSpec{Enable: true, Force: true, PodSelector: sel, TimeoutSeconds: timeout}}
	}
	old, ready, starting := driverPod("old-template", true), driverPod(wanted, true), driverPod(wanted, false)
	pulling := driverPod(wanted, false)
	pulling.Spec.NodeName = "n"
	pulling.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "nvidia-driver",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: `Back-off pulling image "nvcr.io/nvidia/driver:999"`}}}}
	building := driverPod(wanted, false)
	building.Spec.NodeName = "n"
	building.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "driver", Started: ptr.To(false),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	unplaced := driverPod(wanted, false)
	unplaced.Spec.NodeName = ""
	unplaced.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: "0/1 nodes are available: 1 Insufficient memory"}}
	const failedTmpl = "failed-template=" + wanted
	const enrolled = "state upgrade-required -failed-not-ready -failed-template -failure -failure-acknowledged -was-cordoned claim=default started=2026-03-01T12:00:00Z target=" + wanted
	const enrolledCordoned = "state upgrade-required -failed-not-ready -failed-template -failure -failure-acknowledged claim=default started=2026-03-01T12:00:00Z target=" + wanted + " was-cordoned=true"
	const released = "state  -claim -phase-started -started"
	onceMore := func(step string) string {
		return "(once per step on this driver version: lost again in its " + step + " step, it stays failed)"
	}
	crashing := driverPod(wanted, false)
	crashing.Spec.NodeName = "gpu-0"
	crashing.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "nvidia-driver",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s"}}}}
	renamesSmall := sharing.NamesOf(sharing.Source{Policy: &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "dp"}, Data: map[string]string{
		"small": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      rename: small\n      replicas: 4\n"}})
	tests := []struct {
		name    string
		node    *corev1.Node
		driver  *corev1.Pod
		pods    []corev1.Pod
		policy  gpuv1alpha1.DriverUpgradePolicy
		start   bool
		release bool
		elapsed time.Duration
		want    string
		actions []string
	}{
		// Not upgrading: only the budget starts a node, claiming and
		// cordoning it in one patch.
		{name: "idle, not started", node: node("", false), driver: old, want: ""},
		{name: "idle, started", node: node("", false), driver: old, start: true,
			want: gpuv1alpha1.UpgradeRequired, actions: []string{"cordon", enrolled}},
		{name: "idle, started, cordoned by someone else", node: with(node("", true), cordonedBy("kubectl-cordon")), driver: old, start: true,
			want: gpuv1alpha1.UpgradeRequired, actions: []string{enrolledCordoned}},
		{name: "done, started again", node: node(gpuv1alpha1.UpgradeDone, false), driver: old, start: true,
			want: gpuv1alpha1.UpgradeRequired, actions: []string{"cordon", enrolled}},
		{name: "done, not started", node: node(gpuv1alpha1.UpgradeDone, false), driver: ready, want: gpuv1alpha1.UpgradeDone},
		{name: "done without Loom's claim (GPU Operator's), started", node: node(gpuv1alpha1.UpgradeDone, false, "claim", ""), driver: old, start: true,
			want: gpuv1alpha1.UpgradeRequired, actions: []string{"cordon", enrolled}},
		{name: "done, blocked annotation left: cleared on enrolling", node: node(gpuv1alpha1.UpgradeDone, false, "blocked", "x"), driver: old, start: true,
			want: gpuv1alpha1.UpgradeRequired, actions: []string{"cordon", strings.Replace(enrolled, "-failed-not-ready", "-blocked -failed-not-ready", 1)}},

		// A state label without Loom's claim, or another policy's claim, or
		// a value Loom does not know, is never stepped, started or released.
		{name: "foreign: drain-required without claim", node: node(gpuv1alpha1.DrainRequired, true, "claim", ""), driver: old, start: true,
			pods: []corev1.Pod{pod("a", gpus)}, want: gpuv1alpha1.DrainRequired},
		{name: "foreign: upgrade-required without claim", node: node(gpuv1alpha1.UpgradeRequired, false, "claim", ""), driver: old, start: true,
			want: gpuv1alpha1.UpgradeRequired},
		{name: "foreign: uncordon-required without claim", node: node(gpuv1alpha1.UncordonRequired, true, "claim", "", "started", t0.Format(time.RFC3339)), driver: ready,
			want: gpuv1alpha1.UncordonRequired},
		{name: "foreign: another policy's claim", node: node(gpuv1alpha1.PodRestartRequired, true, "claim", "other"), driver: old,
			want: gpuv1alpha1.PodRestartRequired},
		{name: "foreign: failed without claim, started", node: node(gpuv1alpha1.UpgradeFailed, true, "claim", ""), driver: old, start: true,
			want: gpuv1alpha1.UpgradeFailed},
		{name: "foreign: released, untouched", node: node(gpuv1alpha1.DrainRequired, true, "claim", "", "started", t0.Format(time.RFC3339)), release: true,
			want: gpuv1alpha1.DrainRequired},
		{name: "unknown state", node: node("something-else", false), driver: old, start: true, want: "something-else"},
		{name: "unknown state, unclaimed", node: node("Upgrade-Done", true, "claim", ""), driver: old, start: true, want: "Upgrade-Done"},

		// upgrade-failed waits for a new template, or for the wanted driver.
		{name: "failed, retried", node: node(gpuv1alpha1.UpgradeFailed, true, "failed-template", "older"), driver: old, start: true,
			want: gpuv1alpha1.UpgradeRequired, actions: []string{enrolled}},
		{name: "failed, retried, someone else's cordon kept", node: node(gpuv1alpha1.UpgradeFailed, true, "failed-template", "older", "was-cordoned", "true"),
			driver: old, start: true, want: gpuv1alpha1.UpgradeRequired, actions: []string{enrolledCordoned}},
		{name: "failed, retried, uncordoned by a person meanwhile", node: node(gpuv1alpha1.UpgradeFailed, false, "failed-template", "older"), driver: old, start: true,
			want: gpuv1alpha1.UpgradeRequired, actions: []string{"cordon", enrolled}},
		{name: "failed, wanted driver ready after all", node: node(gpuv1alpha1.UpgradeFailed, true, "failure", "x", "failed-template", wanted), driver: ready,
			want: gpuv1alpha1.UncordonRequired, actions: []string{"state uncordon-required -failed-not-ready -failed-template -failure -failure-acknowledged"}},
		{name: "failed, wanted driver not ready", node: node(gpuv1alpha1.UpgradeFailed, true), driver: starting, want: gpuv1alpha1.UpgradeFailed},
		{name: "failed, old driver", node: node(gpuv1alpha1.UpgradeFailed, true), driver: old, elapsed: 24 * time.Hour, want: gpuv1alpha1.UpgradeFailed},

		// upgrade-required moves on: the cordon came with the claim.
		{name: "required", node: node(gpuv1alpha1.UpgradeRequired, true), driver: old,
			want: gpuv1alpha1.WaitForJobsRequired, actions: []string{"state wait-for-jobs-required"}},

		// wait-for-jobs-required waits for the selected pods or its timeout.
		{name: "wait: no waitForCompletion", node: node(gpuv1alpha1.WaitForJobsRequired, true), policy: none,
			want: gpuv1alpha1.PodDeletionRequired, actions: []string{"state pod-deletion-required"}},
		{name: "wait: job running", node: node(gpuv1alpha1.WaitForJobsRequired, true), policy: waitFor("job=batch", 0), elapsed: 24 * time.Hour,
			pods: []corev1.Pod{pod("job", labelled("job", "batch")), pod("other")}, want: gpuv1alpha1.WaitForJobsRequired},
		{name: "wait: job finished", node: node(gpuv1alpha1.WaitForJobsRequired, true), policy: waitFor("job=batch", 0),
			pods:    []corev1.Pod{pod("job", labelled("job", "batch"), done), pod("other")},
			want:    gpuv1alpha1.PodDeletionRequired,
			actions: []string{"state pod-deletion-required"}},
		{name: "wait: Loom's operands are not waited for", node: node(gpuv1alpha1.WaitForJobsRequired, true), policy: waitFor("job=batch", 0),
			pods: []corev1.Pod{pod("validator", labelled("job", "batch"), operand)}, want: gpuv1alpha1.PodDeletionRequired, actions: []string{"state pod-deletion-required"}},
		{name: "wait: within the timeout", node: node(gpuv1alpha1.WaitForJobsRequired, true), policy: waitFor("job=batch", 60), elapsed: 59 * time.Second,
			pods: []corev1.Pod{pod("job", labelled("job", "batch"))}, want: gpuv1alpha1.WaitForJobsRequired},
		{name: "wait: past the timeout", node: node(gpuv1alpha1.WaitForJobsRequired, true), policy: waitFor("job=batch", 60), elapsed: 61 * time.Second,
			pods: []corev1.Pod{pod("job", labelled("job", "batch"))}, want: gpuv1alpha1.PodDeletionRequired, actions: []string{"state pod-deletion-required"}},
		{name: "wait: timeout from the upgrade start without a phase start",
			node: func() *corev1.Node {
				n := node(gpuv1alpha1.WaitForJobsRequired, true, "started", t0.Format(time.RFC3339))
				delete(n.Annotations, gpuv1alpha1.AnnotationPhaseStarted)
				return n
			}(),
			policy: waitFor("job=batch", 60), elapsed: 61 * time.Second,
			pods: []corev1.Pod{pod("job", labelled("job", "batch"))}, want: gpuv1alpha1.PodDeletionRequired, actions: []string{"state pod-deletion-required"}},
		{name: "wait: bad selector", node: node(gpuv1alpha1.WaitForJobsRequired, true), policy: waitFor("job in (", 0),
			want:    gpuv1alpha1.UpgradeFailed,
			actions: []string{`state upgrade-failed ` + failedTmpl + ` failure=waitForCompletion.podSelector "job in (": unable to parse requirement: found '', expected: ',', ')' or identifier`}},

		// pod-deletion-required evicts the GPU pods, within its timeout.
		{name: "delete: no GPU pods", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: none,
			pods:    []corev1.Pod{pod("cpu"), pod("ds", gpus, daemon), pod("static", gpus, mirror), pod("finished", gpus, done), pod("operand", gpus, operand)},
			want:    gpuv1alpha1.DrainRequired,
			actions: []string{"state drain-required"}},
		{name: "delete: evicts GPU pods", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: none,
			pods: []corev1.Pod{pod("a", gpus), pod("cpu"), pod("b", gpus)}, want: gpuv1alpha1.PodDeletionRequired, actions: []string{"evict default/a,default/b"}},
		{name: "delete: evicts MIG and shared GPU pods", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: none,
			pods: []corev1.Pod{pod("mig", asks("nvidia.com/mig-1g.10gb")), pod("shared", asks("nvidia.com/gpu.shared")),
				pod("mig-shared", asks("nvidia.com/mig-3g.40gb.shared")), pod("other", asks("example.com/fpga"))},
			want: gpuv1alpha1.PodDeletionRequired, actions: []string{"evict default/mig,default/shared,default/mig-shared"}},
		{name: "delete: evicts pods of a GPU the sharing config renames, not a NIC's", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: none,
			pods: []corev1.Pod{pod("small", asks("nvidia.com/small")), pod("nic", asks("nvidia.com/rdma_shared_device_a"))},
			want: gpuv1alpha1.PodDeletionRequired, actions: []string{"evict default/small"}},
		{name: "delete: no controller without force", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: deletion(false, false, 300),
			pods: []corev1.Pod{pod("bare", gpus, bare)}, want: gpuv1alpha1.PodDeletionRequired},
		{name: "delete: no controller with force", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: deletion(true, false, 300),
			pods: []corev1.Pod{pod("bare", gpus, bare)}, want: gpuv1alpha1.PodDeletionRequired, actions: []string{"evict default/bare"}},
		{name: "delete: emptyDir without deleteEmptyDir", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: deletion(true, false, 300),
			pods: []corev1.Pod{pod("scratch", gpus, emptyDir)}, want: gpuv1alpha1.PodDeletionRequired},
		{name: "delete: emptyDir with deleteEmptyDir", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: deletion(true, true, 300),
			pods: []corev1.Pod{pod("scratch", gpus, emptyDir)}, want: gpuv1alpha1.PodDeletionRequired, actions: []string{"evict default/scratch"}},
		{name: "delete: a terminating pod is waited for", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: none,
			pods: []corev1.Pod{pod("going", gpus, terminating)}, want: gpuv1alpha1.PodDeletionRequired},
		{name: "delete: within the default timeout", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: none, elapsed: 299 * time.Second,
			pods: []corev1.Pod{pod("held", gpus)}, want: gpuv1alpha1.PodDeletionRequired, actions: []string{"evict default/held"}},
		{name: "delete: past the default timeout", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: none, elapsed: 301 * time.Second,
			pods: []corev1.Pod{pod("held", gpus)}, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"evict default/held", "state upgrade-failed " + failedTmpl +
				" failure=GPU pods still on the node after podDeletion.timeoutSeconds (5m0s): 1 pods left (evictions refused, e.g. by a PodDisruptionBudget)"}},
		{name: "delete: past the policy's timeout, naming the refused", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: deletion(false, false, 3), elapsed: 4 * time.Second,
			pods: []corev1.Pod{pod("bare", gpus, bare), pod("scratch", gpus, emptyDir)}, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed " + failedTmpl + " failure=GPU pods still on the node after podDeletion.timeoutSeconds (3s): 2 pods left; " +
				"not evicted: default/bare has no controller (force evicts it), default/scratch has emptyDir data (deleteEmptyDir evicts it)"}},
		{name: "delete: timeout 0 waits for ever", node: node(gpuv1alpha1.PodDeletionRequired, true), policy: deletion(true, true, 0), elapsed: 24 * time.Hour,
			pods: []corev1.Pod{pod("held", gpus)}, want: gpuv1alpha1.PodDeletionRequired, actions: []string{"evict default/held"}},

		// drain-required evicts the selected pods when the policy drains.
		{name: "drain: off", node: node(gpuv1alpha1.DrainRequired, true), policy: none, pods: []corev1.Pod{pod("cpu")},
			want: gpuv1alpha1.PodRestartRequired, actions: []string{"state pod-restart-required"}},
		{name: "drain: selected pods only", node: node(gpuv1alpha1.DrainRequired, true), policy: drain("drain=yes", 60),
			pods: []corev1.Pod{pod("me", labelled("drain", "yes")), pod("stays")}, want: gpuv1alpha1.DrainRequired, actions: []string{"evict default/me"}},
		{name: "drain: everything but DaemonSets without a selector", node: node(gpuv1alpha1.DrainRequired, true), policy: drain("", 60),
			pods: []corev1.Pod{pod("a"), pod("ds", daemon), pod("b", bare)}, want: gpuv1alpha1.DrainRequired, actions: []string{"evict default/a,default/b"}},
		{name: "drain: nothing left", node: node(gpuv1alpha1.DrainRequired, true), policy: drain("drain=yes", 60),
			pods: []corev1.Pod{pod("stays")}, want: gpuv1alpha1.PodRestartRequired, actions: []string{"state pod-restart-required"}},
		{name: "drain: within the timeout", node: node(gpuv1alpha1.DrainRequired, true), policy: drain("drain=yes", 60), elapsed: 60 * time.Second,
			pods: []corev1.Pod{pod("me", labelled("drain", "yes"))}, want: gpuv1alpha1.DrainRequired, actions: []string{"evict default/me"}},
		{name: "drain: past the timeout", node: node(gpuv1alpha1.DrainRequired, true), policy: drain("drain=yes", 60), elapsed: 61 * time.Second,
			pods: []corev1.Pod{pod("me", labelled("drain", "yes"))}, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"evict default/me", "state upgrade-failed " + failedTmpl +
				" failure=drain did not finish within drain.timeoutSeconds (1m0s): 1 pods left (evictions refused, e.g. by a PodDisruptionBudget)"}},
		{name: "drain: bad selector", node: node(gpuv1alpha1.DrainRequired, true), policy: drain("drain in (", 60), want: gpuv1alpha1.UpgradeFailed,
			actions: []string{`state upgrade-failed ` + failedTmpl + ` failure=drain.podSelector "drain in (": unable to parse requirement: found '', expected: ',', ')' or identifier`}},

		// A refused eviction (the node's blocked annotation) is named when
		// the phase times out; a new state clears it.
		{name: "delete: past the timeout, blocked", node: node(gpuv1alpha1.PodDeletionRequired, true, "blocked", "evicting default/held: forbidden"), policy: none,
			elapsed: 301 * time.Second, pods: []corev1.Pod{pod("held", gpus)}, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"evict default/held", "state upgrade-failed -blocked " + failedTmpl +
				" failure=GPU pods still on the node after podDeletion.timeoutSeconds (5m0s): 1 pods left (evictions refused, e.g. by a PodDisruptionBudget); " +
				"last refused eviction: evicting default/held: forbidden"}},
		{name: "delete: blocked, pods gone", node: node(gpuv1alpha1.PodDeletionRequired, true, "blocked", "x"), policy: none,
			want: gpuv1alpha1.DrainRequired, actions: []string{"state drain-required -blocked"}},

		// A node NotReady or unreachable (no kubelet: its pods cannot finish
		// terminating, its new driver cannot start) is not failed by a phase
		// timeout; its time counts again from when it is Ready again. On
		// an unreachable node a pod terminating for more than 5 minutes
		// counts as gone, as cluster-api's drain has it. NotReady for more
		// than 10 minutes of its upgrade, the node is lost: it fails, freeing
		// its slot, marked to retry once Ready.
		{name: "delete: unreachable past the timeout waits", node: with(node(gpuv1alpha1.PodDeletionRequired, true), readiness(corev1.ConditionUnknown, time.Minute)),
			policy: none, elapsed: 11 * time.Minute, pods: []corev1.Pod{pod("held", gpus)}, want: gpuv1alpha1.PodDeletionRequired, actions: []string{"evict default/held"}},
		{name: "delete: unreachable, a pod terminating for 5 minutes is waited for", node: with(node(gpuv1alpha1.PodDeletionRequired, true), readiness(corev1.ConditionUnknown, 0)),
			policy: none, elapsed: 10 * time.Minute, pods: []corev1.Pod{pod("going", gpus, terminatingSince(5*time.Minute))}, want: gpuv1alpha1.PodDeletionRequired},
		{name: "delete: unreachable, a pod terminating for longer is gone", node: with(node(gpuv1alpha1.PodDeletionRequired, true), readiness(corev1.ConditionUnknown, 0)),
			policy: none, elapsed: 10 * time.Minute, pods: []corev1.Pod{pod("going", gpus, terminatingSince(5*time.Minute-time.Second))},
			want: gpuv1alpha1.DrainRequired, actions: []string{"state drain-required"}},
		{name: "delete: NotReady but reporting, a pod terminating for long is waited for", node: with(node(gpuv1alpha1.PodDeletionRequired, true), readiness(corev1.ConditionFalse, 0)),
			policy: none, elapsed: 10 * time.Minute, pods: []corev1.Pod{pod("going", gpus, terminating)}, want: gpuv1alpha1.PodDeletionRequired},
		{name: "drain: unreachable past the timeout waits", node: with(node(gpuv1alpha1.DrainRequired, true), readiness(corev1.ConditionUnknown, 0)),
			policy: drain("", 60), elapsed: 10 * time.Minute, pods: []corev1.Pod{pod("me", terminatingSince(9*time.Minute))}, want: gpuv1alpha1.DrainRequired},
		{name: "drain: unreachable, pods terminating for long are drained", node: with(node(gpuv1alpha1.DrainRequired, true), readiness(corev1.ConditionUnknown, 0)),
			policy: drain("", 60), elapsed: 10 * time.Minute, pods: []corev1.Pod{pod("me", terminatingSince(time.Minute))},
			want: gpuv1alpha1.PodRestartRequired, actions: []string{"state pod-restart-required"}},
		{name: "drain: Ready again, the timeout counts from then", node: with(node(gpuv1alpha1.DrainRequired, true), readiness(corev1.ConditionTrue, time.Hour)),
			policy: drain("", 60), elapsed: time.Hour + 60*time.Second, pods: []corev1.Pod{pod("me")}, want: gpuv1alpha1.DrainRequired, actions: []string{"evict default/me"}},
		{name: "drain: Ready again, past the timeout", node: with(node(gpuv1alpha1.DrainRequired, true), readiness(corev1.ConditionTrue, time.Hour)),
			policy: drain("", 60), elapsed: time.Hour + 61*time.Second, pods: []corev1.Pod{pod("me")}, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"evict default/me", "state upgrade-failed " + failedTmpl +
				" failure=drain did not finish within drain.timeoutSeconds (1m0s): 1 pods left (evictions refused, e.g. by a PodDisruptionBudget)"}},
		{name: "validate: NotReady past the timeout waits", node: with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted), readiness(corev1.ConditionFalse, time.Minute)),
			elapsed: 11 * time.Minute, want: gpuv1alpha1.ValidationRequired},
		{name: "drain: unreachable for more than 10 minutes is lost", node: with(node(gpuv1alpha1.DrainRequired, true), func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", LastTransitionTime: metav1.NewTime(t0)}}
		}), policy: drain("", 60), elapsed: 10*time.Minute + time.Second, pods: []corev1.Pod{pod("me", terminating)}, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed failed-not-ready=true " + failedTmpl + " failure=node gpu-0 was NotReady for 10m1s (Ready Unknown (NodeStatusUnknown)) " +
				"in drain-required, longer than 10m0s: its upgrade slot is freed, and it retries once Ready " + onceMore("drain") + " lost=drain:" + wanted}},
		// NotReady since before its upgrade began (a failed node retried):
		// the time counts from the upgrade's start.
		{name: "validate: NotReady since before the upgrade, 10 minutes into it waits",
			node:    with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted, "started", t0.Format(time.RFC3339)), readiness(corev1.ConditionFalse, -time.Hour)),
			elapsed: 10 * time.Minute, want: gpuv1alpha1.ValidationRequired},
		{name: "required: NotReady since before the upgrade, longer into it is lost",
			node:    with(node(gpuv1alpha1.UpgradeRequired, true, "started", t0.Format(time.RFC3339)), readiness(corev1.ConditionFalse, -time.Hour)),
			elapsed: 10*time.Minute + time.Second, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed failed-not-ready=true " + failedTmpl + " failure=node gpu-0 was NotReady for 10m1s (Ready False) " +
				"in upgrade-required, longer than 10m0s: its upgrade slot is freed, and it retries once Ready " + onceMore("cordon") + " lost=cordon:" + wanted}},
		{name: "validate: no Ready condition for more than 10 minutes of its upgrade is lost",
			node:    with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted, "started", t0.Format(time.RFC3339)), func(n *corev1.Node) { n.Status.Conditions = nil }),
			elapsed: time.Hour, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed failed-not-ready=true " + failedTmpl + " failure=node gpu-0 was NotReady for 1h0m0s (no Ready condition) " +
				"in validation-required, longer than 10m0s: its upgrade slot is freed, and it retries once Ready " + onceMore("driver") + " lost=driver:" + wanted}},
		// Lost in its driver step (the new driver replaced or validated:
		// it may be what took the node down), a node retries once per
		// driver version; lost there again, it stays failed.
		{name: "validate: lost with a crash-looping driver, retried once", node: with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted, "started", t0.Format(time.RFC3339)),
			readiness(corev1.ConditionFalse, 0)), driver: crashing, elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed failed-not-ready=true " + failedTmpl + " failure=node gpu-0 was NotReady for 11m0s (Ready False) in validation-required, longer than 10m0s; " +
				"its new driver pod loom-driver-x: container nvidia-driver waits: CrashLoopBackOff: back-off 5m0s: its upgrade slot is freed, and it retries once Ready " + onceMore("driver") + " lost=driver:" + wanted}},
		{name: "validate: lost again on the same driver version stays failed", node: with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted, "started", t0.Format(time.RFC3339),
			"lost", "driver:"+wanted), readiness(corev1.ConditionFalse, 0)), driver: crashing, elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed " + failedTmpl + " failure=node gpu-0 was NotReady for 11m0s (Ready False) in validation-required, longer than 10m0s; " +
				"its new driver pod loom-driver-x: container nvidia-driver waits: CrashLoopBackOff: back-off 5m0s, the second time in its driver step on this driver version: " +
				"it stays failed until a new driver version (or its wanted driver runs ready after all)"}},
		{name: "restart: lost again on the same driver version stays failed", node: with(node(gpuv1alpha1.PodRestartRequired, true, "started", t0.Format(time.RFC3339),
			"lost", "driver:"+wanted), readiness(corev1.ConditionFalse, 0)), driver: old, elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed " + failedTmpl + " failure=node gpu-0 was NotReady for 11m0s (Ready False) in pod-restart-required, longer than 10m0s, " +
				"the second time in its driver step on this driver version: it stays failed until a new driver version (or its wanted driver runs ready after all)"}},
		{name: "validate: lost on an older driver version before, retried once on this one", node: with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted,
			"started", t0.Format(time.RFC3339), "lost", "driver:older"), readiness(corev1.ConditionFalse, 0)), elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed failed-not-ready=true " + failedTmpl + " failure=node gpu-0 was NotReady for 11m0s (Ready False) in validation-required, longer than 10m0s: " +
				"its upgrade slot is freed, and it retries once Ready " + onceMore("driver") + " lost=driver:" + wanted}},
		// So is a node lost in any other step (a flapping kubelet, a drain
		// that overloads it): once per step on a driver version.
		{name: "drain: lost in another step before is retried", node: with(node(gpuv1alpha1.DrainRequired, true, "started", t0.Format(time.RFC3339),
			"lost", "driver:"+wanted), readiness(corev1.ConditionFalse, 0)), policy: drain("", 60), elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed failed-not-ready=true " + failedTmpl + " failure=node gpu-0 was NotReady for 11m0s (Ready False) in drain-required, longer than 10m0s: " +
				"its upgrade slot is freed, and it retries once Ready " + onceMore("drain") + " lost=driver,drain:" + wanted}},
		{name: "drain: lost again in its drain step stays failed", node: with(node(gpuv1alpha1.DrainRequired, true, "started", t0.Format(time.RFC3339),
			"lost", "drain:"+wanted), readiness(corev1.ConditionFalse, 0)), policy: drain("", 60), elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed " + failedTmpl + " failure=node gpu-0 was NotReady for 11m0s (Ready False) in drain-required, longer than 10m0s, " +
				"the second time in its drain step on this driver version: it stays failed until a new driver version (or its wanted driver runs ready after all)"}},
		{name: "wait for jobs: lost again stays failed", node: with(node(gpuv1alpha1.WaitForJobsRequired, true, "started", t0.Format(time.RFC3339),
			"lost", "cordon,wait-for-jobs:"+wanted), readiness(corev1.ConditionFalse, 0)), policy: waitFor("app=train", 0), elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed " + failedTmpl + " failure=node gpu-0 was NotReady for 11m0s (Ready False) in wait-for-jobs-required, longer than 10m0s, " +
				"the second time in its wait-for-jobs step on this driver version: it stays failed until a new driver version (or its wanted driver runs ready after all)"}},
		{name: "delete: lost in its step on an older driver version is retried", node: with(node(gpuv1alpha1.PodDeletionRequired, true, "started", t0.Format(time.RFC3339),
			"lost", "pod-deletion:older"), readiness(corev1.ConditionFalse, 0)), policy: none, elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed failed-not-ready=true " + failedTmpl + " failure=node gpu-0 was NotReady for 11m0s (Ready False) in pod-deletion-required, longer than 10m0s: " +
				"its upgrade slot is freed, and it retries once Ready " + onceMore("pod-deletion") + " lost=pod-deletion:" + wanted}},
		{name: "uncordon: lost with an annotation not Loom's is retried", node: with(node(gpuv1alpha1.UncordonRequired, false, "started", t0.Format(time.RFC3339),
			"lost", "someone's"), readiness(corev1.ConditionFalse, 0)), elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed,
			actions: []string{"state upgrade-failed failed-not-ready=true " + failedTmpl + " failure=node gpu-0 was NotReady for 11m0s (Ready False) in uncordon-required, longer than 10m0s: " +
				"its upgrade slot is freed, and it retries once Ready " + onceMore("uncordon") + " lost=uncordon:" + wanted}},
		{name: "lost in the driver step, Ready: retried, remembering it", node: node(gpuv1alpha1.UpgradeFailed, true, "failed-not-ready", "true", "failed-template", wanted,
			"lost", "driver:"+wanted), driver: old, start: true, want: gpuv1alpha1.UpgradeRequired, actions: []string{enrolled}},
		{name: "lost in the driver step of an older version, retried on a new one: forgotten", node: node(gpuv1alpha1.UpgradeFailed, true, "failed-template", "older",
			"lost", "driver:older"), driver: old, start: true, want: gpuv1alpha1.UpgradeRequired, actions: []string{strings.Replace(enrolled, "-failure-acknowledged", "-failure-acknowledged -lost", 1)}},
		{name: "uncordon: a finished upgrade forgets a loss", node: node(gpuv1alpha1.UncordonRequired, true, "was-cordoned", "true", "lost", "driver:"+wanted), driver: ready,
			want: gpuv1alpha1.UpgradeDone, actions: []string{"state upgrade-done -lost -phase-started -started -target -was-cordoned"}},
		{name: "lost, still NotReady: stays failed", node: with(node(gpuv1alpha1.UpgradeFailed, true, "failed-not-ready", "true", "failed-template", wanted),
			readiness(corev1.ConditionFalse, -time.Hour)), elapsed: time.Hour, want: gpuv1alpha1.UpgradeFailed},
		{name: "validate: no Ready condition past the timeout waits", node: with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted), func(n *corev1.Node) { n.Status.Conditions = nil }),
			elapsed: time.Hour, want: gpuv1alpha1.ValidationRequired},

		// pod-restart-required replaces an outdated driver pod.
		{name: "restart: outdated driver", node: node(gpuv1alpha1.PodRestartRequired, true), driver: old,
			want: gpuv1alpha1.ValidationRequired, actions: []string{"delete driver loom-system/loom-driver-x", "state validation-required target=" + wanted}},
		{name: "restart: wanted driver already", node: node(gpuv1alpha1.PodRestartRequired, true), driver: starting,
			want: gpuv1alpha1.ValidationRequired, actions: []string{"state validation-required target=" + wanted}},
		{name: "restart: no driver pod", node: node(gpuv1alpha1.PodRestartRequired, true),
			want: gpuv1alpha1.ValidationRequired, actions: []string{"state validation-required target=" + wanted}},

		// validation-required waits for the new driver, 10 minutes at most.
		{name: "validate: ready", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted), driver: ready,
			want: gpuv1alpha1.UncordonRequired, actions: []string{"state uncordon-required"}},
		{name: "validate: not ready yet", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted), driver: starting, elapsed: 10 * time.Minute,
			want: gpuv1alpha1.ValidationRequired},
		{name: "validate: not replaced yet", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted), elapsed: time.Minute, want: gpuv1alpha1.ValidationRequired},
		{name: "validate: past the timeout", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted), driver: starting, elapsed: 10*time.Minute + time.Second,
			want: gpuv1alpha1.UpgradeFailed, actions: []string{"state upgrade-failed " + failedTmpl + " failure=the new driver pod was not ready within 10m0s"}},
		{name: "validate: the old driver past the timeout", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted), driver: old, elapsed: time.Hour,
			want: gpuv1alpha1.UpgradeFailed, actions: []string{"state upgrade-failed " + failedTmpl + " failure=the new driver pod was not ready within 10m0s: pod loom-driver-x still runs the old driver"}},
		{name: "validate: no driver pod past the timeout", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted), elapsed: time.Hour,
			want: gpuv1alpha1.UpgradeFailed, actions: []string{"state upgrade-failed " + failedTmpl + " failure=the new driver pod was not ready within 10m0s: no driver pod runs on the node (the DaemonSet made none: see its events)"}},
		{name: "validate: an image that cannot be pulled is named", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted), driver: pulling, elapsed: time.Hour,
			want: gpuv1alpha1.UpgradeFailed, actions: []string{"state upgrade-failed " + failedTmpl + ` failure=the new driver pod was not ready within 10m0s: pod loom-driver-x: container nvidia-driver waits: ImagePullBackOff: Back-off pulling image "nvcr.io/nvidia/driver:999"`}},
		{name: "validate: a driver that never answered its startup probe is named", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted), driver: building, elapsed: time.Hour,
			want: gpuv1alpha1.UpgradeFailed, actions: []string{"state upgrade-failed " + failedTmpl + " failure=the new driver pod was not ready within 10m0s: pod loom-driver-x: " +
				"container driver runs, but its driver does not answer (its startup probe's nvidia-smi has not passed: still building or loading it, or failed; see the container's log)"}},
		{name: "validate: a driver pod the scheduler cannot place is named", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted), driver: unplaced, elapsed: time.Hour,
			want: gpuv1alpha1.UpgradeFailed, actions: []string{"state upgrade-failed " + failedTmpl + " failure=the new driver pod was not ready within 10m0s: pod loom-driver-x: not placed: 0/1 nodes are available: 1 Insufficient memory"}},
		{name: "validate: a second version bump restarts the driver for it", node: node(gpuv1alpha1.ValidationRequired, true, "target", "middle"),
			driver: driverPod("middle", false), want: gpuv1alpha1.PodRestartRequired, actions: []string{"state pod-restart-required target=" + wanted}},
		{name: "validate: the newest driver ready already", node: node(gpuv1alpha1.ValidationRequired, true, "target", "middle"), driver: ready,
			want: gpuv1alpha1.UncordonRequired, actions: []string{"state uncordon-required"}},

		// uncordon-required finishes, lifting only Loom's own cordon.
		{name: "uncordon", node: node(gpuv1alpha1.UncordonRequired, true, "started", t0.Format(time.RFC3339), "target", wanted), driver: ready,
			want: gpuv1alpha1.UpgradeDone, actions: []string{"uncordon", "state upgrade-done -phase-started -started -target -was-cordoned"}},
		{name: "uncordon: cordoned by someone else", node: node(gpuv1alpha1.UncordonRequired, true, "was-cordoned", "true"), driver: ready,
			want: gpuv1alpha1.UpgradeDone, actions: []string{"state upgrade-done -phase-started -started -target -was-cordoned"}},
		{name: "uncordon: a person re-cordoned during the upgrade", node: with(node(gpuv1alpha1.UncordonRequired, true, "started", t0.Format(time.RFC3339)), cordonedBy("kubectl-cordon")),
			driver: ready, want: gpuv1alpha1.UpgradeDone, actions: []string{"state upgrade-done -phase-started -started -target -was-cordoned"}},
		{name: "uncordon: a person uncordoned during the upgrade", node: with(node(gpuv1alpha1.UncordonRequired, false, "started", t0.Format(time.RFC3339)), cordonedBy("kubectl-cordon")),
			driver: ready, want: gpuv1alpha1.UpgradeDone, actions: []string{"state upgrade-done -phase-started -started -target -was-cordoned"}},

		// A release (policy deleted, driver disabled) lets go of every
		// claimed node in any state, lifting only Loom's own cordon.
		{name: "release: draining", node: node(gpuv1alpha1.DrainRequired, true, "started", t0.Format(time.RFC3339)), release: true, pods: []corev1.Pod{pod("a")},
			want: "", actions: []string{"uncordon", released}},
		{name: "release: someone else's cordon stays", node: node(gpuv1alpha1.ValidationRequired, true, "started", t0.Format(time.RFC3339), "was-cordoned", "true"), release: true,
			want: "", actions: []string{released + " -was-cordoned"}},
		{name: "release: a person re-cordoned", node: with(node(gpuv1alpha1.WaitForJobsRequired, true, "started", t0.Format(time.RFC3339)), cordonedBy("kubectl-cordon")), release: true,
			want: "", actions: []string{released}},
		{name: "release: failed", node: node(gpuv1alpha1.UpgradeFailed, true, "started", t0.Format(time.RFC3339), "failure", "f", "failed-template", wanted), release: true,
			want: "", actions: []string{"uncordon", "state  -claim -failed-template -failure -phase-started -started"}},
		{name: "release: done", node: node(gpuv1alpha1.UpgradeDone, false), release: true, want: "", actions: []string{"state  -claim -phase-started"}},
		{name: "release: an unknown state keeps its label", node: node("something-else", false), release: true,
			want: "something-else", actions: []string{"state something-else -claim -phase-started"}},
		{name: "claimed, its label removed by a person: let go", node: node("", true, "claim", policy, "started", t0.Format(time.RFC3339)), driver: old, start: true,
			want: "", actions: []string{"uncordon", "state  -claim -phase-started -started"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := t0.Add(tt.elapsed)
			before := tt.node.DeepCopy()
			state, acts := next(tt.node, tt.driver, tt.pods, target{policy: tt.policy, claim: policy, template: wanted, namespace: loomNS, start: tt.start, release: tt.release, gpus: renamesSmall}, now)
			if got := show(acts, now); state != tt.want || !slices.Equal(got, tt.actions) {
				t.Errorf("next = %q\n  %q\nwant %q\n  %q", state, got, tt.want, tt.actions)
			}
			if (state != tt.node.Labels[gpuv1alpha1.LabelUpgradeState]) && !slices.ContainsFunc(acts, func(a action) bool { return a.kind == setState }) {
				t.Errorf("state %q from %q, but actions %v", state, tt.node.Labels[gpuv1alpha1.LabelUpgradeState], show(acts, now))
			}
			if !equalNodes(before, tt.node) {
				t.Error("next changed the node it was given")
			}
		})
	}
}

func equalNodes(a, b *corev1.Node) bool {
	return a.Spec.Unschedulable == b.Spec.Unschedulable && maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Annotations, b.Annotations)
}

// Time annotations Loom cannot count from (unreadable, or in the future:
// a person's, another tool's, a clock far ahead) restart the step's clock
// in a pass of their own, with a warning naming them, instead of failing
// the node at once or stalling it until then; a Ready condition that
// changed in the future (a kubelet's clock ahead) is no stall either.
func TestNextRestartsUnusableClocks(t *testing.T) {
	future := t0.Add(10 * 365 * 24 * time.Hour).Format(time.RFC3339)
	const phase, started = gpuv1alpha1.AnnotationPhaseStarted, gpuv1alpha1.AnnotationUpgradeStarted
	notReadySince := func(since time.Duration) func(*corev1.Node) { return readiness(corev1.ConditionFalse, since) }
	tests := []struct {
		name    string
		node    *corev1.Node
		elapsed time.Duration
		want    string
		// restamped are the annotations set to now ("": none, the node
		// steps as usual to want), and warning a part of the warning.
		restamped []string
		warning   string
	}{
		{name: "unreadable phase start, Ready for long", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted, "phase-started", "yesterday"),
			want: gpuv1alpha1.ValidationRequired, restamped: []string{phase}, warning: phase + `="yesterday": not an RFC 3339 time in the past; the validation-required step's timeouts count from now`},
		{name: "phase start in the future", node: node(gpuv1alpha1.DrainRequired, true, "phase-started", future),
			want: gpuv1alpha1.DrainRequired, restamped: []string{phase}, warning: phase + `="` + future + `"`},
		{name: "phase start 30 s ahead (another replica's clock): kept", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted,
			"phase-started", t0.Add(30*time.Second).Format(time.RFC3339)), want: gpuv1alpha1.ValidationRequired},
		{name: "empty phase start", node: node(gpuv1alpha1.WaitForJobsRequired, true, "phase-started", ""),
			want: gpuv1alpha1.WaitForJobsRequired, restamped: []string{phase}, warning: phase + `=""`},
		{name: "no phase start, none of the upgrade either", node: with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted), func(n *corev1.Node) { delete(n.Annotations, phase) }),
			want: gpuv1alpha1.ValidationRequired, restamped: []string{phase}, warning: "no " + phase},
		{name: "no phase start, the upgrade's counts", node: with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted, "started", t0.Format(time.RFC3339)),
			func(n *corev1.Node) { delete(n.Annotations, phase) }), elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed},
		{name: "upgrade start unreadable, NotReady", node: with(node(gpuv1alpha1.PodDeletionRequired, true, "started", "1.5.2026"), notReadySince(0)), elapsed: time.Minute,
			want: gpuv1alpha1.PodDeletionRequired, restamped: []string{started}, warning: started + `="1.5.2026"`},
		{name: "both in the future", node: node(gpuv1alpha1.UncordonRequired, true, "started", future, "phase-started", future),
			want: gpuv1alpha1.UncordonRequired, restamped: []string{phase, started}},
		{name: "valid clocks: a step as usual", node: node(gpuv1alpha1.ValidationRequired, true, "target", wanted, "started", t0.Format(time.RFC3339)), elapsed: 11 * time.Minute,
			want: gpuv1alpha1.UpgradeFailed},
		{name: "Ready since a time in the future: the phase's time counts", node: with(node(gpuv1alpha1.ValidationRequired, true, "target", wanted), readiness(corev1.ConditionTrue, 365*24*time.Hour)),
			elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed},
		{name: "NotReady since a time in the future: the upgrade's time counts", node: with(node(gpuv1alpha1.DrainRequired, true, "started", t0.Format(time.RFC3339)), notReadySince(365*24*time.Hour)),
			elapsed: 11 * time.Minute, want: gpuv1alpha1.UpgradeFailed},
		{name: "failed: its clocks are not read", node: node(gpuv1alpha1.UpgradeFailed, true, "phase-started", "x", "failed-template", wanted), want: gpuv1alpha1.UpgradeFailed},
		{name: "foreign: untouched", node: node(gpuv1alpha1.DrainRequired, true, "claim", "", "phase-started", "x"), want: gpuv1alpha1.DrainRequired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := t0.Add(tt.elapsed)
			state, acts := next(tt.node, nil, nil, target{claim: policy, template: wanted, namespace: loomNS}, now)
			if state != tt.want {
				t.Fatalf("state %q, want %q (%v)", state, tt.want, show(acts, now))
			}
			var restamped []string
			var warning string
			for _, a := range acts {
				warning += a.warning
				if a.warning == "" {
					continue
				}
				for k, v := range a.annotations {
					if v == nil || *v != now.Format(time.RFC3339) {
						t.Errorf("restamp sets %s to %v", k, v)
					}
					restamped = append(restamped, k)
				}
			}
			slices.Sort(restamped)
			if !slices.Equal(restamped, tt.restamped) || !strings.Contains(warning, tt.warning) || (warning == "") != (tt.warning == "" && tt.restamped == nil) {
				t.Errorf("restamped %v, warning %q; want %v, %q", restamped, warning, tt.restamped, tt.warning)
			}
		})
	}
}
