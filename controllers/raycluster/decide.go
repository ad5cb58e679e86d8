package raycluster

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
)

// Loom's own condition types on a RayCluster, beside KubeRay's.
const (
	// ConditionGang: the gang scheduler the cluster asked for is usable.
	ConditionGang = "loom.dev/GangScheduling"
	// ConditionGPUs: every group's pods fit some node of this cluster.
	ConditionGPUs = "loom.dev/GPUInventory"
	// ConditionValid: the spec passes KubeRay's validation and Loom's
	// (group names, replica bounds, derived names, the pod limit).
	ConditionValid = "loom.dev/SpecValid"
	// ConditionReady: every pod of the cluster runs and is ready (KubeRay
	// has no such condition; kstatus-based tools read it).
	ConditionReady = "Ready"
	// ConditionReconciling and ConditionStalled are kstatus's (Helm's
	// --wait, Flux, cli-utils): Reconciling is True while Loom creates,
	// replaces or waits for the cluster's pods, Stalled while only a
	// person can move it on (a spec Loom refuses, a name taken, Volcano
	// missing), which kstatus reads as Failed.
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
)

// Reasons of Loom's conditions.
const (
	// ReasonInvalidSpec: ConditionValid is False, naming the fields.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonTooManyPods: ConditionValid is False: the cluster asks for
	// more pods than --max-workload-pods.
	ReasonTooManyPods = "TooManyPods"
	// ReasonNameConflict: ReplicaFailure is True: a name the cluster
	// wants (a pod, a Service) is taken by an object it does not control,
	// which is left alone.
	ReasonNameConflict = "NameConflict"
)

// conditions are the condition types the RayCluster reconciler writes:
// KubeRay's and Loom's own.
var conditions = []string{
	string(rayv1.RayClusterProvisioned), string(rayv1.HeadPodReady), string(rayv1.RayClusterReplicaFailure),
	string(rayv1.RayClusterSuspending), string(rayv1.RayClusterSuspended),
	ConditionGang, ConditionGPUs, ConditionValid, ConditionReady, ConditionReconciling, ConditionStalled,
}

// observed is what one reconcile sees.
type observed struct {
	// pods of the cluster (cache plus expectations).
	pods []*corev1.Pod
	// headService is the head Service, nil when absent; oldHeads are the
	// cluster's head Services of another name (headService renamed).
	headService *corev1.Service
	oldHeads    []*corev1.Service
	podGroup    *schedulingv1beta1.PodGroup
	volcano     bool
	// queue is what stops Volcano from admitting the cluster's gang to
	// the queue it names (the zero value: nothing, or not checked).
	queue gang.QueueProblem
	// autoGang: the manager's --gang-scheduler is auto, so a cluster
	// asking for Volcano where it is missing runs without a gang.
	autoGang bool
	// fits per group name (head and workers): the inventory's verdict on
	// one pod of the group.
	fits map[string]inventory.FitResult
	// maxPods is the most pods the cluster may ask for (the manager's
	// --max-workload-pods; 0: its default).
	maxPods int
	// refused is why the API server refuses the pods of the groups that
	// lack pods (the decision's preflight), naming the fields; "" when it
	// admits them or was not asked.
	refused string
	now     time.Time
}

// decision is what the reconcile must do.
type decision struct {
	status rayv1.RayClusterStatus
	// create are pods to create; remove are pods to delete.
	create, remove []*corev1.Pod
	// podGroup is the PodGroup to ensure; removePodGroup: the cluster's
	// PodGroup must go.
	podGroup       *schedulingv1beta1.PodGroup
	removePodGroup bool
	// children are the other children to ensure (the Services); shared
	// are those created as KubeRay does, left alone when someone else's
	// (the autoscaler's ServiceAccount, Role and RoleBinding).
	children, shared []client.Object
	// unwanted are children turned off or renamed (unwantedChildren,
	// observed.oldHeads), to delete when Loom's and the cluster's.
	unwanted []client.Object
	// err is why a child could not be built; it is reported as a failed
	// apply.
	err error
	// skipped are the optional children (not the head Service) left out
	// because an object the cluster does not control holds their names:
	// the apply sets it, and it is reported as a NameConflict.
	skipped error
	// events are the notable transitions to record.
	events []event
	// deferred are the missing pods not built this pass (the executor's
	// per-pass cap): the next pass builds them.
	deferred int64
	// guard: the status suspends or resumes the cluster, and must be
	// written only over the copy it was computed from.
	guard bool
	// preflight are one pod of each group that lacks pods and the head
	// Service when it is not there, for the API server to admit (a dry
	// run) before anything is made.
	preflight []prototype
}

// prototype is a child as it is built (a pod of a group, the head
// Service), what it is, and where what it is built from is in the
// cluster's spec ("" when the message says it). known: the child exists,
// and only what a refused write of it said is asked (no dry run).
type prototype struct {
	what, path string
	obj        client.Object
	known      bool
}

// event is a notable transition, recorded on the cluster.
type event struct {
	warning     bool
	reason, msg string
}

// group is one pod group of the cluster as decide sees it.
type group struct {
	name string
	// path is where its template is in the cluster's spec.
	path    string
	desired int64
	// pod is the group's pod as built now (without a name, when the name
	// is generated); its template stamp is stamp.
	pod   *corev1.Pod
	stamp stamp
	spec  *rayv1.WorkerGroupSpec // nil for the head
	pods  []*corev1.Pod          // live (not terminating, not finished)
}

func setCond(st *rayv1.RayClusterStatus, t string, s metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	apply.SetCondition(&st.Conditions, t, s, reason, msg, gen, now)
}

// pass is one decision in the making: the cluster (normalized), what was
// observed, its live pods by group and the decision so far.
type pass struct {
	// ctx is what KubeRay's builders log through. They log each pod they
	// build at info (three lines a pod, the whole ray start command), which
	// is debug detail here: it goes one verbosity down, seen with
	// --log-level=debug. Their errors still log.
	ctx context.Context
	rc  *rayv1.RayCluster
	obs observed
	// sched is the cluster's gang scheduler.
	sched string
	// gangOff: the cluster asked for Volcano, which is missing, and the
	// manager's auto runs it without a gang; ConditionGang says so.
	gangOff bool
	// pods are the observed pods the cluster controls; any other is
	// neither counted nor touched.
	pods []*corev1.Pod
	// byGroup are the live pods (not terminating, not finished) by group.
	byGroup map[string][]*corev1.Pod
	// missing are the pods each group lacks, in rollout order, for build.
	missing []shortfall
	// held: the cluster asks for too many pods; scale only deletes, and
	// rolls nothing.
	held bool
	d    decision
}

// shortfall is how many pods a group lacks.
type shortfall struct {
	g *group
	n int64
}

// set sets a condition of the pass's status.
func (p *pass) set(t string, s metav1.ConditionStatus, reason, msg string) {
	setCond(&p.d.status, t, s, reason, msg, p.rc.Generation, p.obs.now)
}

func (p *pass) event(warning bool, reason, msg string) {
	p.d.events = append(p.d.events, event{warning: warning, reason: reason, msg: msg})
}

// phases are decide's steps, in order; a step that returns true has
// completed the decision.
var phases = []func(*pass) bool{
	begin,
	validate,
	sortPods,
	suspend,
	resume,
	volcano,
	children,
	inventoryGaps,
	scale,
	build,
	status,
}

// decide computes the cluster's next pods and status from what was observed.
// rc is normalized (defaults filled in).
func decide(ctx context.Context, rc *rayv1.RayCluster, obs observed, sched string) decision {
	p := &pass{ctx: log.IntoContext(ctx, log.FromContext(ctx).V(1)), rc: rc, obs: obs, sched: sched, d: decision{status: *rc.Status.DeepCopy()}}
	for _, phase := range phases {
		if phase(p) {
			break
		}
	}
	settle(p)
	return p.d
}

// begin records the generation seen and keeps the pods the cluster
// controls: a pod of another owner (a stale cache, a hand-made pod with the
// cluster's labels) is never counted, kept or deleted.
func begin(p *pass) bool {
	p.d.status.ObservedGeneration = p.rc.Generation
	p.pods = make([]*corev1.Pod, 0, len(p.obs.pods))
	for _, pod := range p.obs.pods {
		if metav1.IsControlledBy(pod, p.rc) {
			p.pods = append(p.pods, pod)
		}
	}
	return false
}

// validate holds a cluster whose spec KubeRay's validators or Loom's
// reject, whose pods the API server refuses (obs.refused), or that asks
// for more pods than the manager allows: no pod is created, and the
// condition names the fields. A spec Loom cannot read deletes pods only
// when the cluster is suspended, which needs nothing of the spec: Kueue
// suspends a cluster to take its quota back, and the pods must not
// outlive it. One that only asks for too many pods (the autoscaler raised
// a group's replicas past the limit) still has the pods it no longer asks
// for deleted: those in workersToDelete, beyond a group's replicas, of a
// group gone, finished; so the autoscaler scales down and an idle cluster
// gives its GPUs back. No outdated pod is rolled while it is held.
func validate(p *pass) bool {
	st := &p.d.status
	reason, msg := "", ""
	if err := validateCluster(p.rc, p.sched); err != nil {
		reason, msg = ReasonInvalidSpec, err.Error()
	} else if msg = podLimit(p.rc, p.obs.maxPods); msg != "" {
		reason = ReasonTooManyPods
	}
	if reason == "" && p.obs.refused != "" {
		reason, msg = ReasonInvalidSpec, p.obs.refused
	}
	if reason == "" {
		meta.RemoveStatusCondition(&st.Conditions, ConditionValid)
		return false
	}
	p.set(ConditionValid, metav1.ConditionFalse, reason, msg)
	setState(st, "", p.obs.now)
	if reason == ReasonTooManyPods {
		p.held = true
		sortPods(p)
		scale(p)
		p.missing = nil
		return true
	}
	suspend(p)
	return true
}

// sortPods sorts the live pods by group. Finished or failed pods are
// deleted (restartPolicy Never leaves them) and replaced; terminating ones
// count for nothing.
func sortPods(p *pass) bool {
	p.byGroup = map[string][]*corev1.Pod{}
	for _, pod := range p.pods {
		switch {
		case pod.DeletionTimestamp != nil:
		case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
			p.d.remove = append(p.d.remove, pod)
		default:
			p.byGroup[groupOf(pod)] = append(p.byGroup[groupOf(pod)], pod)
		}
	}
	return false
}

// suspend: while spec.suspend is set, every pod and the PodGroup are
// deleted; the cluster says Suspending until they are gone, then Suspended.
func suspend(p *pass) bool {
	if p.rc.Spec.Suspend == nil || !*p.rc.Spec.Suspend {
		return false
	}
	st := &p.d.status
	p.d.guard = true
	p.d.remove = nil // every pod goes, the finished ones sortPods chose included, once
	left := 0
	for _, pod := range p.pods {
		if pod.DeletionTimestamp == nil {
			p.d.remove = append(p.d.remove, pod)
		}
		left++
	}
	p.d.removePodGroup = true
	if left > 0 {
		p.set(string(rayv1.RayClusterSuspending), metav1.ConditionTrue, "Suspending", fmt.Sprintf("deleting %d pods", left))
		p.set(string(rayv1.RayClusterSuspended), metav1.ConditionFalse, "Suspending", fmt.Sprintf("deleting %d pods", left))
		// A ready cluster stays "ready" until its last pod is gone: Kueue
		// reads that state as the cluster still running, and releases its
		// quota only once the pods no longer hold the GPUs.
		if st.State != rayv1.Ready {
			setState(st, "", p.obs.now)
		}
	} else {
		p.set(string(rayv1.RayClusterSuspending), metav1.ConditionFalse, "Suspended", "every pod is deleted")
		p.set(string(rayv1.RayClusterSuspended), metav1.ConditionTrue, "Suspended", "spec.suspend is true: every pod is deleted")
		setState(st, rayv1.Suspended, p.obs.now)
	}
	st.ReadyWorkerReplicas, st.AvailableWorkerReplicas = 0, 0
	st.Head = rayv1.HeadInfo{}
	p.set(string(rayv1.HeadPodReady), metav1.ConditionFalse, "Suspended", "the cluster is suspended")
	return true
}

// resume: a cluster leaving suspension says so; its pods come back below.
func resume(p *pass) bool {
	conds := p.d.status.Conditions
	if meta.IsStatusConditionTrue(conds, string(rayv1.RayClusterSuspended)) || meta.IsStatusConditionTrue(conds, string(rayv1.RayClusterSuspending)) {
		p.d.guard = true
		p.set(string(rayv1.RayClusterSuspended), metav1.ConditionFalse, "Resumed", "spec.suspend is false")
		p.set(string(rayv1.RayClusterSuspending), metav1.ConditionFalse, "Resumed", "spec.suspend is false")
	}
	return false
}

// volcano holds a cluster that asks for Volcano while Volcano is not
// installed: no pods, a condition saying why. Under the manager's
// --gang-scheduler=auto it runs instead, without a gang, and says so.
func volcano(p *pass) bool {
	if p.sched != gang.SchedulerName || p.obs.volcano {
		return false
	}
	if p.obs.autoGang {
		p.sched, p.gangOff = "", true
		p.set(ConditionGang, metav1.ConditionFalse, "VolcanoNotInstalled", "gang scheduling off: Volcano is not installed; pods are scheduled one by one "+
			"(the cluster's "+LabelScheduler+" label asks for Volcano; the manager's --gang-scheduler=auto runs it without a gang)")
		return false
	}
	msg := "the cluster asks for Volcano (label " + LabelScheduler + " or the manager's --gang-scheduler) but Volcano's PodGroup CRD is not installed: no pods are created until it is; install Volcano, or label the cluster " + LabelScheduler + "=none"
	p.set(ConditionGang, metav1.ConditionFalse, "VolcanoNotInstalled", msg)
	setState(&p.d.status, "", p.obs.now)
	status(p)
	return true
}

// children wants the cluster's Services and autoscaler RBAC and, with
// Volcano, its PodGroup; a PodGroup left from when the cluster asked for
// Volcano goes. The head Service is built from what the user wrote
// (spec.headGroupSpec.headService, serviceType, the head container's
// ports): not there yet, it is for the preflight's dry run first; there,
// a write of it as it is now that the API server refused holds the
// cluster as well.
func children(p *pass) bool {
	p.d.children, p.d.shared, p.d.err = buildChildren(p.ctx, p.rc)
	if p.d.err == nil {
		p.d.unwanted = unwantedChildren(p.rc, slices.Concat(p.d.children, p.d.shared), p.obs.oldHeads)
		if svc := headServicePrototype(p.ctx, p.rc); svc != nil {
			p.d.preflight = append(p.d.preflight, prototype{what: headServiceWhat, obj: svc, known: p.obs.headService != nil})
		}
	}
	if p.sched != gang.SchedulerName {
		switch {
		case p.sched != "" && p.sched != "none":
			// A typo, or a scheduler KubeRay gangs through and Loom does
			// not (yunikorn, scheduler-plugins): say so rather than run
			// pod by pod without a word.
			p.gangOff = true
			p.set(ConditionGang, metav1.ConditionFalse, "UnknownScheduler", fmt.Sprintf("gang scheduling off: the cluster's %s label names %q, "+
				"and Loom gangs only through %q; pods are scheduled one by one (set the label to %q, or to \"none\")", LabelScheduler, p.sched, gang.SchedulerName, gang.SchedulerName))
		case !p.gangOff:
			meta.RemoveStatusCondition(&p.d.status.Conditions, ConditionGang)
		}
		p.d.removePodGroup = true
		return false
	}
	p.d.podGroup = gang.PodGroup(gangSpec(p.ctx, p.rc))
	s, reason, msg := gangCondition(p.d.podGroup, p.obs.podGroup, p.obs.queue)
	p.set(ConditionGang, s, reason, msg)
	return false
}

// gangCondition is ConditionGang of a cluster gang-scheduled through want:
// False while Volcano holds its PodGroup (have), with Volcano's reason, or
// while its queue keeps Volcano from admitting it; True otherwise.
func gangCondition(want, have *schedulingv1beta1.PodGroup, queue gang.QueueProblem) (metav1.ConditionStatus, string, string) {
	phase := schedulingv1beta1.PodGroupPhase("")
	if have != nil {
		phase = have.Status.Phase
	}
	admitted := phase != "" && phase != schedulingv1beta1.PodGroupPending
	switch reason, why := gang.Unschedulable(have); {
	case !admitted && queue.Reason != "":
		return metav1.ConditionFalse, queue.Reason, fmt.Sprintf("PodGroup %s: %s", want.Name, queue.Message)
	case why != "" && (phase == schedulingv1beta1.PodGroupPending || phase == schedulingv1beta1.PodGroupInqueue):
		return metav1.ConditionFalse, reason, fmt.Sprintf("Volcano holds PodGroup %s (%s): %s", want.Name, phase, why)
	case phase == schedulingv1beta1.PodGroupPending:
		return metav1.ConditionTrue, "GangPending", fmt.Sprintf("gang-scheduled by Volcano through PodGroup %s, which waits for Volcano to admit it to queue %s", want.Name, want.Spec.Queue)
	}
	return metav1.ConditionTrue, "PodGroupCreated", fmt.Sprintf("gang-scheduled by Volcano through PodGroup %s", want.Name)
}

// inventoryGaps says, for a group whose single pod no node of this
// cluster can hold (more GPUs per pod than any node, or a product that is
// not there), what is missing.
func inventoryGaps(p *pass) bool {
	st, fits := &p.d.status, p.obs.fits
	var gaps []string
	names := make([]string, 0, len(fits))
	for n := range fits {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if f := fits[n]; f.Verdict == inventory.Never {
			gaps = append(gaps, fmt.Sprintf("group %s: %s", n, f.Message))
		}
	}
	if len(gaps) == 0 {
		if c := meta.FindStatusCondition(st.Conditions, ConditionGPUs); c != nil && c.Status == metav1.ConditionFalse {
			p.set(ConditionGPUs, metav1.ConditionTrue, "Fits", "every group's pod fits a node of this cluster")
		}
		return false
	}
	msg := strings.Join(gaps, "; ")
	if c := meta.FindStatusCondition(st.Conditions, ConditionGPUs); c == nil || c.Status != metav1.ConditionFalse || c.Message != msg {
		p.event(true, "NeverFits", msg)
	}
	p.set(ConditionGPUs, metav1.ConditionFalse, "NeverFits", msg)
	return false
}
