package driverupgrade

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/podset"
	"github.com/loom-dev/loom/internal/sharing"
)

const (
	// validationTimeout bounds the wait for a new driver pod to be ready.
	validationTimeout = 10 * time.Minute
	// defaultPodDeletionTimeout applies when the policy has no podDeletion.
	defaultPodDeletionTimeout = 300 * time.Second
	// unreachableGrace is how long a pod on an unreachable node may have
	// been terminating before it counts as gone (no kubelet will confirm
	// it), as cluster-api's drain skips such pods.
	unreachableGrace = 5 * time.Minute
	// notReadyTimeout bounds how long an upgrading node may be NotReady or
	// unreachable: past it the node fails (its maxParallelUpgrades slot is
	// free, and it counts towards maxFailures: a new driver that crashes
	// its node is the failure maxFailures is for), and it retries once
	// Ready again. cluster-api's MachineHealthCheck and the node lifecycle
	// controller's eviction (5 minutes) bound a lost node the same way.
	notReadyTimeout = 10 * time.Minute
)

// actionKind is what an action does.
type actionKind int

const (
	// cordon and uncordon set the node's spec.unschedulable.
	cordon actionKind = iota
	uncordon
	// evict evicts the action's pods through the eviction API.
	evict
	// deleteDriver deletes the node's outdated driver pod (the DaemonSet
	// replaces it from the new template).
	deleteDriver
	// setState moves the node to the action's state, setting (nil:
	// removing) the action's annotations with it.
	setState
)

// action is one thing next asks of the reconciler: data, so that the
// transition is a pure function and its tests need no API server.
type action struct {
	kind        actionKind
	pods        []*corev1.Pod
	state       string
	annotations map[string]*string
	// warning, on a setState, is what the reconciler records as a Warning
	// event on the node: what Loom made of annotations it cannot use.
	warning string
}

// target is what the rollout wants of one node.
type target struct {
	policy gpuv1alpha1.DriverUpgradePolicy
	// claim is the ClusterPolicy's name, the value of the claim annotation
	// on the nodes it enrolls.
	claim string
	// template is the pod template hash of the driver DaemonSet that owns
	// the node's driver pod (or, without one, the template the node's
	// upgrade is for).
	template string
	// namespace is Loom's: its operand pods are neither waited for nor
	// evicted.
	namespace string
	// start: the budget lets this node begin (or retry) its upgrade.
	start bool
	// release: the policy is gone or its driver disabled; Loom lets go of
	// the node (lifts its own cordon, removes its label and annotations).
	release bool
	// gpus are the resources GPUs are advertised under: a pod asking for
	// one goes before the driver.
	gpus sharing.Names
}

// next is one node's transition, GPU Operator's state machine: from the
// node's state (its label and annotations, as the API server has them),
// its driver pod (nil: none), the pods on it and the clock, the state it
// moves to (at most one step) and the actions that get it there. The waits
// and timeouts of a state count from AnnotationPhaseStarted. Only a node
// carrying t.claim is stepped; an unclaimed one only begins (when the
// budget starts it) from no state or upgrade-done, and a node in a state
// Loom does not know is never touched, claimed or not, except that a
// release lets go of Loom's claim on it.
func next(node *corev1.Node, driver *corev1.Pod, pods []corev1.Pod, t target, now time.Time) (string, []action) {
	s := transition{node: node, driver: driver, pods: pods, t: t, now: now}
	claimed := s.claimed()
	switch {
	case t.release || (claimed && s.state() == ""):
		// A person removing the state label from a claimed node ends its
		// upgrade there, as a release does.
		return s.letGo()
	case !claimed && s.state() != "" && s.state() != gpuv1alpha1.UpgradeDone:
		return s.stay()
	case inFlight(s.state()):
		if state, acts, ok := s.restamp(); ok {
			return state, acts
		}
		if d := s.notReadyFor(); d > notReadyTimeout {
			return s.lost(d)
		}
	}
	if step, ok := steps[s.state()]; ok {
		return step(s)
	}
	return s.stay()
}

// steps is the state machine: each state's transition, in order.
var steps = map[string]func(transition) (string, []action){
	"":                              transition.begin,
	gpuv1alpha1.UpgradeDone:         transition.begin,
	gpuv1alpha1.UpgradeRequired:     transition.required,
	gpuv1alpha1.WaitForJobsRequired: transition.waitForJobs,
	gpuv1alpha1.PodDeletionRequired: transition.deletePods,
	gpuv1alpha1.DrainRequired:       transition.drain,
	gpuv1alpha1.PodRestartRequired:  transition.restartDriver,
	gpuv1alpha1.ValidationRequired:  transition.validate,
	gpuv1alpha1.UncordonRequired:    transition.uncordon,
	gpuv1alpha1.UpgradeFailed:       transition.failed,
}

// transition is one call of next.
type transition struct {
	node   *corev1.Node
	driver *corev1.Pod
	pods   []corev1.Pod
	t      target
	now    time.Time
}

func (s transition) state() string { return s.node.Labels[gpuv1alpha1.LabelUpgradeState] }

func (s transition) claimed() bool {
	return s.t.claim != "" && s.node.Annotations[gpuv1alpha1.AnnotationClaim] == s.t.claim
}

func (s transition) nowString() *string { return ptr.To(s.now.UTC().Format(time.RFC3339)) }

// to moves the node to state after acts, stamping when the state began.
func (s transition) to(state string, annotations map[string]*string, acts ...action) (string, []action) {
	ann := map[string]*string{gpuv1alpha1.AnnotationPhaseStarted: s.nowString()}
	if _, ok := s.node.Annotations[gpuv1alpha1.AnnotationBlocked]; ok {
		ann[gpuv1alpha1.AnnotationBlocked] = nil // a new state, a new try
	}
	for k, v := range annotations {
		ann[k] = v
	}
	return state, append(acts, action{kind: setState, state: state, annotations: ann})
}

func (s transition) stay(acts ...action) (string, []action) { return s.state(), acts }

// begin enrolls an upgraded (or never upgraded) node when the budget
// starts it: the claim, the first state, the cordon and the record of a
// cordon that was already there go in one patch, which the reconciler
// sends conditional on the node's resourceVersion.
func (s transition) begin() (string, []action) {
	if !s.t.start {
		return s.stay()
	}
	ann := map[string]*string{gpuv1alpha1.AnnotationClaim: ptr.To(s.t.claim), gpuv1alpha1.AnnotationTarget: ptr.To(s.t.template),
		gpuv1alpha1.AnnotationUpgradeStarted: s.nowString(), gpuv1alpha1.AnnotationFailure: nil, gpuv1alpha1.AnnotationFailedTemplate: nil,
		gpuv1alpha1.AnnotationFailureAcknowledged: nil, gpuv1alpha1.AnnotationFailedNotReady: nil, gpuv1alpha1.AnnotationWasCordoned: nil}
	if _, ok := s.node.Annotations[gpuv1alpha1.AnnotationLost]; ok && s.lostIn() == nil {
		ann[gpuv1alpha1.AnnotationLost] = nil // another driver version: a fresh retry
	}
	var acts []action
	switch {
	case !s.node.Spec.Unschedulable:
		acts = append(acts, action{kind: cordon})
	case s.claimed() && s.state() == gpuv1alpha1.UpgradeFailed:
		// A retry: the cordon is the failed upgrade's, as recorded then.
		if v, ok := s.node.Annotations[gpuv1alpha1.AnnotationWasCordoned]; ok {
			ann[gpuv1alpha1.AnnotationWasCordoned] = ptr.To(v)
		}
	default:
		ann[gpuv1alpha1.AnnotationWasCordoned] = ptr.To("true")
	}
	return s.to(gpuv1alpha1.UpgradeRequired, ann, acts...)
}

// fail moves the node to upgrade-failed, saying why (and the last refused
// eviction, if any): it stays cordoned until the next driver template
// retries it.
func (s transition) fail(why string, acts ...action) (string, []action) {
	if b := s.node.Annotations[gpuv1alpha1.AnnotationBlocked]; b != "" {
		why += "; last refused eviction: " + b
	}
	return s.to(gpuv1alpha1.UpgradeFailed, map[string]*string{
		gpuv1alpha1.AnnotationFailure: ptr.To(why), gpuv1alpha1.AnnotationFailedTemplate: ptr.To(s.t.template)}, acts...)
}

// failed retries the node when the budget starts it (a new template), and
// finishes its upgrade when the wanted driver runs ready after all (a
// person replaced it, or a new policy brought it back).
func (s transition) failed() (string, []action) {
	switch {
	case s.t.start:
		return s.begin()
	case runsWanted(s.driver, s.t.template):
		return s.to(gpuv1alpha1.UncordonRequired, map[string]*string{gpuv1alpha1.AnnotationFailure: nil,
			gpuv1alpha1.AnnotationFailedTemplate: nil, gpuv1alpha1.AnnotationFailureAcknowledged: nil, gpuv1alpha1.AnnotationFailedNotReady: nil})
	}
	return s.stay()
}

// required moves an enrolled node on: its cordon came with its claim.
func (s transition) required() (string, []action) {
	return s.to(gpuv1alpha1.WaitForJobsRequired, nil)
}

// waitForJobs waits until no pod waitForCompletion selects runs on the
// node, or its timeout passes (the pods are then evicted with the GPU
// pods).
func (s transition) waitForJobs() (string, []action) {
	w := s.t.policy.WaitForCompletion
	if w == nil || w.PodSelector == "" {
		return s.to(gpuv1alpha1.PodDeletionRequired, nil)
	}
	sel, err := gpuv1alpha1.ParseSelector(w.PodSelector)
	if err != nil {
		return s.fail(fmt.Sprintf("waitForCompletion.podSelector %q: %v", w.PodSelector, err))
	}
	running := s.running(func(p *corev1.Pod) bool { return sel.Matches(labels.Set(p.Labels)) })
	timeout := time.Duration(w.TimeoutSeconds) * time.Second
	if len(running) == 0 || (timeout > 0 && s.inPhase() > timeout) {
		return s.to(gpuv1alpha1.PodDeletionRequired, nil)
	}
	return s.stay()
}

// deletePods evicts the node's GPU pods (whole GPUs, MIG devices or
// shared replicas: all go away with the driver); past podDeletion's timeout with
// pods left, the node fails.
func (s transition) deletePods() (string, []action) {
	force, emptyDir, timeout := false, false, defaultPodDeletionTimeout
	if d := s.t.policy.PodDeletion; d != nil {
		force, emptyDir, timeout = d.Force, d.DeleteEmptyDir, time.Duration(d.TimeoutSeconds)*time.Second
	}
	left, acts, blocked := s.evict(func(p *corev1.Pod) bool { return inventory.UsesGPUs(&p.Spec, s.t.gpus) }, force, emptyDir)
	if left == 0 {
		return s.to(gpuv1alpha1.DrainRequired, nil)
	}
	if timeout > 0 && s.overdue(timeout) {
		return s.fail(fmt.Sprintf("GPU pods still on the node after podDeletion.timeoutSeconds (%s): %s", timeout, describe(left, blocked)), acts...)
	}
	return s.stay(acts...)
}

// drain evicts the pods drain selects (all, without a selector) when the
// policy drains; past its timeout with pods left, the node fails.
func (s transition) drain() (string, []action) {
	d := s.t.policy.Drain
	if d == nil || !d.Enable {
		return s.to(gpuv1alpha1.PodRestartRequired, nil)
	}
	sel := labels.Everything()
	if d.PodSelector != "" {
		var err error
		if sel, err = gpuv1alpha1.ParseSelector(d.PodSelector); err != nil {
			return s.fail(fmt.Sprintf("drain.podSelector %q: %v", d.PodSelector, err))
		}
	}
	left, acts, blocked := s.evict(func(p *corev1.Pod) bool { return sel.Matches(labels.Set(p.Labels)) }, d.Force, d.DeleteEmptyDir)
	if left == 0 {
		return s.to(gpuv1alpha1.PodRestartRequired, nil)
	}
	if timeout := time.Duration(d.TimeoutSeconds) * time.Second; timeout > 0 && s.overdue(timeout) {
		return s.fail(fmt.Sprintf("drain did not finish within drain.timeoutSeconds (%s): %s", timeout, describe(left, blocked)), acts...)
	}
	return s.stay(acts...)
}

// restartDriver deletes the node's outdated driver pod, so that the
// DaemonSet (OnDelete) starts the wanted one.
func (s transition) restartDriver() (string, []action) {
	var acts []action
	if s.driver != nil && s.driver.Annotations[gpuv1alpha1.AnnotationTemplateHash] != s.t.template {
		acts = append(acts, action{kind: deleteDriver, pods: []*corev1.Pod{s.driver}})
	}
	return s.to(gpuv1alpha1.ValidationRequired, map[string]*string{gpuv1alpha1.AnnotationTarget: ptr.To(s.t.template)}, acts...)
}

// validate waits for the wanted driver pod to be ready. A new driver
// version while it waits (the DaemonSet's template is no longer the one
// the node restarted for) restarts the driver again, for the new one.
func (s transition) validate() (string, []action) {
	switch {
	case runsWanted(s.driver, s.t.template):
		return s.to(gpuv1alpha1.UncordonRequired, nil)
	case s.t.template != "" && s.node.Annotations[gpuv1alpha1.AnnotationTarget] != s.t.template:
		return s.to(gpuv1alpha1.PodRestartRequired, map[string]*string{gpuv1alpha1.AnnotationTarget: ptr.To(s.t.template)})
	case s.overdue(validationTimeout):
		return s.fail(fmt.Sprintf("the new driver pod was not ready within %s%s", validationTimeout, driverTrouble(s.driver, s.t.template)))
	}
	return s.stay()
}

// driverTrouble says, for a failed validation, what the node's driver pod
// shows: none made yet, still the old one, the kubelet's or the
// scheduler's reason for the new one (an image that cannot be pulled, a
// crash loop, no room on the node), or a container running whose startup
// probe (nvidia-smi) has not passed.
func driverTrouble(driver *corev1.Pod, template string) string {
	switch {
	case driver == nil:
		return ": no driver pod runs on the node (the DaemonSet made none: see its events)"
	case driver.Annotations[gpuv1alpha1.AnnotationTemplateHash] != template:
		return fmt.Sprintf(": pod %s still runs the old driver", driver.Name)
	}
	if why := podset.WaitingWhy(driver); why != "" {
		return fmt.Sprintf(": pod %s: %s", driver.Name, why)
	}
	for _, cs := range driver.Status.ContainerStatuses {
		if cs.State.Running != nil && (cs.Started == nil || !*cs.Started) {
			return fmt.Sprintf(": pod %s: container %s runs, but its driver does not answer (its startup probe's nvidia-smi has not passed: "+
				"still building or loading it, or failed; see the container's log)", driver.Name, cs.Name)
		}
	}
	return ""
}

// uncordon makes the node schedulable again if Loom's cordon is the
// node's (gpuv1alpha1.LoomCordoned), and clears the upgrade's annotations; the claim
// stays with the finished node.
func (s transition) uncordon() (string, []action) {
	var acts []action
	if gpuv1alpha1.LoomCordoned(s.node, s.t.claim) {
		acts = append(acts, action{kind: uncordon})
	}
	ann := map[string]*string{gpuv1alpha1.AnnotationWasCordoned: nil, gpuv1alpha1.AnnotationTarget: nil,
		gpuv1alpha1.AnnotationUpgradeStarted: nil, gpuv1alpha1.AnnotationPhaseStarted: nil}
	if _, ok := s.node.Annotations[gpuv1alpha1.AnnotationLost]; ok {
		ann[gpuv1alpha1.AnnotationLost] = nil
	}
	return s.to(gpuv1alpha1.UpgradeDone, ann, acts...)
}

// letGo ends Loom's hold on a claimed node (a clean exit): it lifts
// Loom's own cordon, removes the state label when its value is one of
// Loom's, and every upgrade annotation. An unclaimed node is not touched.
func (s transition) letGo() (string, []action) {
	if !s.claimed() {
		return s.stay()
	}
	var acts []action
	if gpuv1alpha1.LoomCordoned(s.node, s.t.claim) {
		acts = append(acts, action{kind: uncordon})
	}
	ann := map[string]*string{}
	for k := range s.node.Annotations {
		if strings.HasPrefix(k, upgradeAnnotationPrefix) {
			ann[k] = nil
		}
	}
	state := s.state()
	if gpuv1alpha1.KnownUpgradeState(state) {
		state = ""
	}
	return state, append(acts, action{kind: setState, state: state, annotations: ann})
}

// upgradeAnnotationPrefix starts every node annotation of the upgrade.
const upgradeAnnotationPrefix = "gpu.loom.dev/driver-upgrade-"

// running are the pods on the node that keep accepts, neither finished nor
// Loom's operands, nor terminating for longer than unreachableGrace on an
// unreachable node (its Ready condition Unknown: no kubelet reports), which
// will never confirm they are gone.
func (s transition) running(keep func(*corev1.Pod) bool) []*corev1.Pod {
	ready := inventory.ReadyCondition(s.node)
	unreachable := ready != nil && ready.Status == corev1.ConditionUnknown
	var out []*corev1.Pod
	for i := range s.pods {
		p := &s.pods[i]
		if p.Namespace == s.t.namespace && p.Labels[apply.LabelManagedBy] == apply.ManagedBy {
			continue
		}
		if unreachable && p.DeletionTimestamp != nil && s.now.Sub(p.DeletionTimestamp.Time) > unreachableGrace {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || !keep(p) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// evict chooses, as kubectl drain does, which of the pods keep accepts to
// evict: never DaemonSet or mirror pods, pods without a controller only
// with force, pods with emptyDir volumes only with deleteEmptyDir, and
// none already terminating. It returns how many are left (evicted or not),
// the eviction, and the pods it refused, and why.
func (s transition) evict(keep func(*corev1.Pod) bool, force, deleteEmptyDir bool) (int, []action, []string) {
	pods := s.running(func(p *corev1.Pod) bool {
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			return false
		}
		if c := metav1.GetControllerOf(p); c != nil && c.Kind == "DaemonSet" {
			return false
		}
		return keep(p)
	})
	var evicted []*corev1.Pod
	var blocked []string
	for _, p := range pods {
		switch {
		case p.DeletionTimestamp != nil:
		case !force && metav1.GetControllerOf(p) == nil:
			blocked = append(blocked, p.Namespace+"/"+p.Name+" has no controller (force evicts it)")
		case !deleteEmptyDir && hasEmptyDir(p):
			blocked = append(blocked, p.Namespace+"/"+p.Name+" has emptyDir data (deleteEmptyDir evicts it)")
		default:
			evicted = append(evicted, p)
		}
	}
	var acts []action
	if len(evicted) > 0 {
		acts = append(acts, action{kind: evict, pods: evicted})
	}
	return len(pods), acts, blocked
}

func hasEmptyDir(p *corev1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if v.EmptyDir != nil {
			return true
		}
	}
	return false
}

func describe(left int, blocked []string) string {
	msg := fmt.Sprintf("%d pods left", left)
	if len(blocked) > 0 {
		msg += "; not evicted: " + strings.Join(blocked, ", ")
	} else {
		msg += " (evictions refused, e.g. by a PodDisruptionBudget)"
	}
	return msg
}

// runsWanted reports whether driver is of the wanted template and ready.
func runsWanted(driver *corev1.Pod, template string) bool {
	return driver != nil && driver.Annotations[gpuv1alpha1.AnnotationTemplateHash] == template && podset.Ready(driver)
}

// needsPods reports whether next reads the pods on a node in state.
func needsPods(state string) bool {
	return state == gpuv1alpha1.WaitForJobsRequired || state == gpuv1alpha1.PodDeletionRequired || state == gpuv1alpha1.DrainRequired
}
