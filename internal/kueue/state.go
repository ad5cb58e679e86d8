package kueue

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Eviction reasons after which Kueue requeues a Workload at once
// (jobframework sets Requeued=True only for these).
const (
	reasonPreempted    = "Preempted"
	reasonNodeFailures = "NodeFailures"
	// condRequeued True: Kueue queues the evicted Workload again (at once
	// after a preemption, or once its backoff is over).
	condRequeued = "Requeued"
	// reasonDeactivated starts the reason of a deactivation's eviction
	// (Deactivated, DeactivatedDueToRequeuingLimitExceeded, ...).
	reasonDeactivated = "Deactivated"
)

// PodsReady condition reasons (Kueue's v1beta2 WorkloadWaitForStart,
// WorkloadWaitForRecovery, WorkloadStarted, WorkloadRecovered).
const (
	reasonWaitForStart    = "WaitForStart"
	reasonWaitForRecovery = "WaitForRecovery"
	reasonStarted         = "Started"
	reasonRecovered       = "Recovered"
)

// Cond returns the Workload's condition of type t, or nil.
func (w *Workload) Cond(t string) *metav1.Condition {
	if w == nil {
		return nil
	}
	return meta.FindStatusCondition(w.Status.Conditions, t)
}

func (w *Workload) isTrue(t string) bool {
	c := w.Cond(t)
	return c != nil && c.Status == metav1.ConditionTrue
}

// QuotaReserved: Kueue reserved quota for the Workload (status.admission set).
func (w *Workload) QuotaReserved() bool {
	return w != nil && w.isTrue(CondQuotaReserved) && w.Status.Admission != nil
}

// Admitted: quota reserved and every admission check ready, so the job may
// run.
func (w *Workload) Admitted() bool { return w.QuotaReserved() && w.isTrue(CondAdmitted) }

// Evicted is the Evicted condition while it is True, else nil: the job must
// stop. A deactivation's eviction is over once the Workload is active again
// and holds no quota (Kueue queues it again, and clears the condition only
// at its next admission).
func (w *Workload) Evicted() *metav1.Condition {
	if c := w.Cond(CondEvicted); c != nil && c.Status == metav1.ConditionTrue && w.reactivated() == nil {
		return c
	}
	return nil
}

// reactivated is the Evicted condition of a deactivation since undone (the
// Workload active again, holding no quota), or nil.
func (w *Workload) reactivated() *metav1.Condition {
	c := w.Cond(CondEvicted)
	if c == nil || c.Status != metav1.ConditionTrue || !w.Active() || w.QuotaReserved() || !strings.HasPrefix(c.Reason, reasonDeactivated) {
		return nil
	}
	return c
}

// Active: the Workload is not deactivated (spec.active unset or true).
func (w *Workload) Active() bool {
	return w == nil || w.Spec.Active == nil || *w.Spec.Active
}

// Finished: the Workload was marked finished.
func (w *Workload) Finished() bool { return w.isTrue(CondFinished) }

// Waiting says why a job of this Workload waits, in Kueue's words: the
// queue and Kueue's QuotaReserved message (for a lack of quota "couldn't
// assign flavors to pod set master: insufficient unused quota for
// nvidia.com/gpu in flavor default, 8 more needed"), or the admission checks
// still pending.
func (w *Workload) Waiting() string {
	if w == nil {
		return "waiting for its Kueue Workload to be created"
	}
	q := fmt.Sprintf("queued in Kueue LocalQueue %s/%s", w.Namespace, w.Spec.QueueName)
	if c := w.Evicted(); c != nil {
		msg := fmt.Sprintf("%s; evicted (%s): %s%s", q, c.Reason, c.Message, w.requeueAt())
		if rq := w.Cond(condRequeued); rq != nil && rq.Status == metav1.ConditionTrue && !w.QuotaReserved() {
			msg += "; Kueue queued it again"
		}
		return msg
	}
	if w.QuotaReserved() {
		msg := fmt.Sprintf("%s; quota reserved in ClusterQueue %s, waiting for admission checks", q, w.Status.Admission.ClusterQueue)
		var pending []string
		for _, ac := range w.Status.AdmissionChecks {
			if ac.State != "Ready" {
				pending = append(pending, fmt.Sprintf("%s (%s): %s", ac.Name, ac.State, ac.Message))
			}
		}
		if len(pending) > 0 {
			msg += ": " + strings.Join(pending, "; ")
		}
		return msg
	}
	if c := w.Cond(CondQuotaReserved); c != nil && c.Message != "" {
		// Not the deactivation's word, which the release copied there.
		if ev := w.reactivated(); ev == nil || ev.Message != c.Message {
			return q + ": " + c.Message
		}
	}
	return q + "; waiting for Kueue to consider it"
}

// requeueAt says when Kueue's backoff queues the evicted Workload again (a
// time, not a countdown: the job's status does not change while it waits),
// or "".
func (w *Workload) requeueAt() string {
	rs := w.Status.RequeueState
	if rs == nil || rs.RequeueAt == nil {
		return ""
	}
	msg := "; Kueue queues it again at " + rs.RequeueAt.UTC().Format(time.RFC3339)
	if rs.Count != nil {
		msg += fmt.Sprintf(" (requeue %d)", *rs.Count)
	}
	return msg
}

// AdmittedMessage says where Kueue admitted the Workload: its ClusterQueue
// and each pod set's flavours.
func (w *Workload) AdmittedMessage() string {
	if !w.QuotaReserved() {
		return ""
	}
	var sets []string
	for _, a := range w.Status.Admission.PodSetAssignments {
		var fl []string
		for _, r := range slices.Sorted(maps.Keys(a.Flavors)) {
			fl = append(fl, fmt.Sprintf("%s in flavor %s", r, a.Flavors[r]))
		}
		if len(fl) > 0 {
			sets = append(sets, a.Name+": "+strings.Join(fl, ", "))
		}
	}
	msg := fmt.Sprintf("admitted by Kueue to ClusterQueue %s (LocalQueue %s)", w.Status.Admission.ClusterQueue, w.Spec.QueueName)
	if len(sets) > 0 {
		msg += "; " + strings.Join(sets, "; ")
	}
	return msg
}

// Flavors are the names of the flavours assigned to a pod set, sorted.
func (w *Workload) Flavors(podSet string) []string {
	if !w.QuotaReserved() {
		return nil
	}
	seen := map[string]bool{}
	for _, a := range w.Status.Admission.PodSetAssignments {
		if a.Name != podSet {
			continue
		}
		for _, f := range a.Flavors {
			seen[f] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Placement is what an admission adds to a pod set's pods: the flavours'
// node labels as a node selector and their tolerations, and the admission
// checks' podSetUpdates (labels, annotations, node selector, tolerations).
type Placement struct {
	Labels       map[string]string
	Annotations  map[string]string
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
}

// AddUpdates adds the podSetUpdates the Workload's admission checks give
// the pod set, as jobframework merges them into the pods it starts (a
// ProvisioningRequest check's annotations, without which the pods do not
// consume the capacity it booked). A key the placement has already keeps
// its value.
func (p *Placement) AddUpdates(w *Workload, podSet string) {
	if w == nil {
		return
	}
	for _, ac := range w.Status.AdmissionChecks {
		for _, u := range ac.PodSetUpdates {
			if u.Name != podSet {
				continue
			}
			p.Labels = addMissing(p.Labels, u.Labels)
			p.Annotations = addMissing(p.Annotations, u.Annotations)
			p.NodeSelector = addMissing(p.NodeSelector, u.NodeSelector)
			for _, t := range u.Tolerations {
				if !hasToleration(p.Tolerations, &t) {
					p.Tolerations = append(p.Tolerations, t)
				}
			}
		}
	}
}

// addMissing adds to dst the entries of src whose keys dst lacks.
func addMissing(dst, src map[string]string) map[string]string {
	for k, v := range src {
		if dst == nil {
			dst = map[string]string{}
		}
		if _, set := dst[k]; !set {
			dst[k] = v
		}
	}
	return dst
}

// PlacementOf merges the given flavours (by name; a missing one is
// skipped) into one Placement, in flavour-name order.
func PlacementOf(names []string, flavors map[string]*ResourceFlavor) Placement {
	var p Placement
	for _, n := range names {
		f := flavors[n]
		if f == nil {
			continue
		}
		for k, v := range f.Spec.NodeLabels {
			if p.NodeSelector == nil {
				p.NodeSelector = map[string]string{}
			}
			p.NodeSelector[k] = v
		}
		for _, t := range f.Spec.Tolerations {
			if !hasToleration(p.Tolerations, &t) {
				p.Tolerations = append(p.Tolerations, t)
			}
		}
	}
	return p
}

// Apply adds the placement to a pod: labels, annotations and node
// selector entries (the pod's own win on a conflict, as jobframework's
// merge refuses to override) and tolerations the pod lacks.
func (p Placement) Apply(m *metav1.ObjectMeta, spec *corev1.PodSpec) {
	m.Labels = addMissing(m.Labels, p.Labels)
	m.Annotations = addMissing(m.Annotations, p.Annotations)
	spec.NodeSelector = addMissing(spec.NodeSelector, p.NodeSelector)
	for _, t := range p.Tolerations {
		if !hasToleration(spec.Tolerations, &t) {
			spec.Tolerations = append(spec.Tolerations, t)
		}
	}
}

// SamePodSets reports whether the Workload asks for the pod sets want:
// names, counts and what each container and init container requests and
// limits, which is what Kueue's own jobframework compares (a pod set's
// quota). A Workload that does not must not keep admitting the job: it is
// released and replaced.
func (w *Workload) SamePodSets(want []PodSet) bool {
	if len(w.Spec.PodSets) != len(want) {
		return false
	}
	for i := range want {
		have, want := &w.Spec.PodSets[i], &want[i]
		if have.Name != want.Name || have.Count != want.Count ||
			!sameResources(have.Template.Spec.InitContainers, want.Template.Spec.InitContainers) ||
			!sameResources(have.Template.Spec.Containers, want.Template.Spec.Containers) {
			return false
		}
	}
	return true
}

// Uncovered names a pod set the Workload's admission does not cover whole:
// one without an assignment, or assigned fewer pods than it has (a partial
// admission, which Kueue makes only of a pod set with a minCount, which a
// gang's never has). "" when the admission covers every pod set, or there
// is none.
func (w *Workload) Uncovered() string {
	if !w.QuotaReserved() {
		return ""
	}
	for _, ps := range w.Spec.PodSets {
		i := slices.IndexFunc(w.Status.Admission.PodSetAssignments, func(a PodSetAssignment) bool { return a.Name == ps.Name })
		switch {
		case i < 0:
			return fmt.Sprintf("pod set %s not assigned", ps.Name)
		case w.Status.Admission.PodSetAssignments[i].Count != nil && *w.Status.Admission.PodSetAssignments[i].Count < ps.Count:
			return fmt.Sprintf("pod set %s: %d of %d pods", ps.Name, *w.Status.Admission.PodSetAssignments[i].Count, ps.Count)
		}
	}
	return ""
}

// sameResources: both lists' containers, pairwise, have the same limits
// and the same requests, a request left out where a limit is set counting
// as that limit (as the API server defaults a pod's, and Kueue's webhook a
// Workload's).
func sameResources(a, b []corev1.Container) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		ra, rb := &a[i].Resources, &b[i].Resources
		if !equality.Semantic.DeepEqual(ra.Limits, rb.Limits) || !equality.Semantic.DeepEqual(requests(ra), requests(rb)) {
			return false
		}
	}
	return true
}

// requests is r's requests with the limits that have none filled in.
func requests(r *corev1.ResourceRequirements) corev1.ResourceList {
	out := corev1.ResourceList{}
	for k, v := range r.Limits {
		out[k] = v
	}
	for k, v := range r.Requests {
		out[k] = v
	}
	return out
}

// ReleaseStatus is the status patch that gives back an evicted Workload's
// quota once its job stopped, as jobframework does: no admission,
// QuotaReserved and Admitted False, and Requeued (True after a preemption
// or node failures, so that Kueue queues it again at once). why is the
// message of a release without an eviction.
func ReleaseStatus(w *Workload, why string, now time.Time) map[string]any {
	ev := w.Evicted()
	reason, msg := "Pending", why
	requeue := false
	if ev != nil {
		msg = ev.Message
		requeue = ev.Reason == reasonPreempted || ev.Reason == reasonNodeFailures
		reason = ev.Reason
	}
	conds := slices.Clone(w.Status.Conditions)
	t := metav1.NewTime(now)
	set := func(ty string, s metav1.ConditionStatus, r, m string) {
		meta.SetStatusCondition(&conds, metav1.Condition{Type: ty, Status: s, Reason: r, Message: m, ObservedGeneration: w.Generation, LastTransitionTime: t})
	}
	rq := metav1.ConditionFalse
	if requeue {
		rq = metav1.ConditionTrue
	}
	set(condRequeued, rq, reason, msg)
	set(CondQuotaReserved, metav1.ConditionFalse, "Pending", msg)
	set(CondAdmitted, metav1.ConditionFalse, "NoReservation", "The workload has no reservation")
	if w.Cond(CondPodsReady) != nil {
		// The next admission's gang has yet to start: Kueue's
		// waitForPodsReady timeout must count for it, not see the
		// stopped gang's readiness.
		set(CondPodsReady, metav1.ConditionFalse, reasonWaitForStart, podsNotReadyMsg)
	}
	return map[string]any{"status": map[string]any{"admission": nil, "conditions": conds}}
}

const (
	podsNotReadyMsg   = "Not all pods are ready or succeeded"
	podsRecoveringMsg = "At least one pod has failed, waiting for recovery"
	podsReadyMsg      = "All pods reached readiness and the workload is running"
)

// PodsReadyStatus is the status patch that sets the Workload's PodsReady
// condition as jobframework does for Kueue's own jobs (Kueue reads it under
// its waitForPodsReady configuration, and evicts an admitted Workload whose
// PodsReady is not True within the timeout, or, with a recoveryTimeout, one
// that stays WaitForRecovery too long): True (Started, or Recovered after a
// recovery) while the admitted gang is ready; False WaitForRecovery once a
// ready gang is not; False WaitForStart otherwise. It is nil when the
// condition says so already, and when only WaitForStart would be written
// where there is no condition yet (Kueue reads a missing one as that):
// a Workload costs one write when its gang starts, not one per pass.
func PodsReadyStatus(w *Workload, ready bool, now time.Time) map[string]any {
	cur := w.Cond(CondPodsReady)
	status, reason, msg := metav1.ConditionFalse, reasonWaitForStart, podsNotReadyMsg
	switch {
	case !w.Admitted():
	case ready:
		status, reason, msg = metav1.ConditionTrue, reasonStarted, podsReadyMsg
		if cur != nil && (cur.Reason == reasonWaitForRecovery || cur.Reason == reasonRecovered) {
			reason = reasonRecovered
		}
	case cur != nil && (cur.Status == metav1.ConditionTrue || cur.Reason == reasonWaitForRecovery):
		reason, msg = reasonWaitForRecovery, podsRecoveringMsg
	}
	if cur == nil && status == metav1.ConditionFalse {
		return nil
	}
	if cur != nil && cur.Status == status && cur.Reason == reason {
		return nil
	}
	conds := slices.Clone(w.Status.Conditions)
	meta.SetStatusCondition(&conds, metav1.Condition{Type: CondPodsReady, Status: status, Reason: reason, Message: msg,
		ObservedGeneration: w.Generation, LastTransitionTime: metav1.NewTime(now)})
	return map[string]any{"status": map[string]any{"conditions": conds}}
}

// FinishStatus is the status patch that marks the Workload Finished
// (reason Succeeded or Failed), which releases its quota.
func FinishStatus(w *Workload, succeeded bool, msg string, now time.Time) map[string]any {
	reason := "Failed"
	if succeeded {
		reason = "Succeeded"
	}
	conds := slices.Clone(w.Status.Conditions)
	meta.SetStatusCondition(&conds, metav1.Condition{Type: CondFinished, Status: metav1.ConditionTrue, Reason: reason,
		Message: msg, ObservedGeneration: w.Generation, LastTransitionTime: metav1.NewTime(now)})
	return map[string]any{"status": map[string]any{"conditions": conds}}
}

func hasToleration(ts []corev1.Toleration, t *corev1.Toleration) bool {
	for i := range ts {
		if ts[i].MatchToleration(t) {
			return true
		}
	}
	return false
}
