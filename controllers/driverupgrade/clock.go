// The upgrade's clocks: when a node's step began, what Loom can count
// from, and how long a node has been lost (NotReady).

package driverupgrade

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/podset"
)

// stamp is the time the node's annotation key holds, if it is one Loom
// can count from: an RFC 3339 time not after now (give or take clockSkew,
// a manager replica's clock behind the one that wrote it). A value that is
// not (a person's, another tool's, a later version's format, a clock far
// ahead) counts as none: a time in the future would stall the state until
// then, a time that cannot be read would fail it at once.
func (s transition) stamp(key string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, s.node.Annotations[key])
	return t, err == nil && !t.After(s.now.Add(clockSkew))
}

// clockSkew is how far ahead of this manager's clock a time it wrote (or
// another replica wrote) may be and still count.
const clockSkew = time.Minute

// since is how long ago t was; false when t is in the future (a kubelet's
// clock ahead of Loom's), which counts as unknown.
func (s transition) since(t time.Time) (time.Duration, bool) {
	return s.now.Sub(t), !t.After(s.now)
}

// inPhase is how long the node has been in its state: since its phase's
// stamp, or its upgrade's without one (restamp makes sure one is valid).
func (s transition) inPhase() time.Duration {
	phase, ok := s.stamp(gpuv1alpha1.AnnotationPhaseStarted)
	if !ok {
		phase, _ = s.stamp(gpuv1alpha1.AnnotationUpgradeStarted)
	}
	return s.now.Sub(phase)
}

// restamp restarts the clocks of a node in an upgrade step whose time
// annotations Loom cannot count from (see stamp): a value that is there
// but unusable, or no phase start at all. Its phase (and its upgrade, for
// the NotReady bound) counts from now, in a pass of its own, and the
// warning says which annotation held what; false when the clocks are fine.
func (s transition) restamp() (string, []action, bool) {
	ann := map[string]*string{}
	var bad []string
	for _, key := range []string{gpuv1alpha1.AnnotationUpgradeStarted, gpuv1alpha1.AnnotationPhaseStarted} {
		if v, ok := s.node.Annotations[key]; ok {
			if _, valid := s.stamp(key); !valid {
				ann[key] = s.nowString()
				bad = append(bad, fmt.Sprintf("%s=%q", key, v))
			}
		}
	}
	_, phase := s.stamp(gpuv1alpha1.AnnotationPhaseStarted)
	_, started := s.stamp(gpuv1alpha1.AnnotationUpgradeStarted)
	if !phase && !started && len(bad) == 0 {
		ann[gpuv1alpha1.AnnotationPhaseStarted] = s.nowString()
		bad = append(bad, "no "+gpuv1alpha1.AnnotationPhaseStarted)
	}
	if len(bad) == 0 {
		return "", nil, false
	}
	warning := fmt.Sprintf("%s: not an RFC 3339 time in the past; the %s step's timeouts count from now", strings.Join(bad, ", "), s.state())
	return s.state(), []action{{kind: setState, state: s.state(), annotations: ann, warning: warning}}, true
}

// overdue reports whether the node has been in its state longer than
// timeout while Ready. A node NotReady or unreachable is never overdue:
// without a working kubelet its pods cannot finish terminating nor its new
// driver start, which is not the phase's failure. It waits (at most
// notReadyTimeout: then it is lost), and its time counts again from when it
// is Ready again.
func (s transition) overdue(timeout time.Duration) bool {
	ready := inventory.ReadyCondition(s.node)
	if ready == nil || ready.Status != corev1.ConditionTrue {
		return false
	}
	in := s.inPhase()
	if d, ok := s.since(ready.LastTransitionTime.Time); ok {
		in = min(in, d)
	}
	return in > timeout
}

// inFlight reports whether state is one of an upgrade's steps, between
// its start and its end (done or failed).
func inFlight(state string) bool {
	switch state {
	case "", gpuv1alpha1.UpgradeDone, gpuv1alpha1.UpgradeFailed:
		return false
	}
	return gpuv1alpha1.KnownUpgradeState(state)
}

// notReadyFor is how long the node has been NotReady (or unreachable, or
// without a Ready condition) during its upgrade: 0 when Ready.
func (s transition) notReadyFor() time.Duration {
	c := inventory.ReadyCondition(s.node)
	if c != nil && c.Status == corev1.ConditionTrue {
		return 0
	}
	started, ok := s.stamp(gpuv1alpha1.AnnotationUpgradeStarted)
	var since time.Duration
	sinceOK := c != nil
	if sinceOK {
		since, sinceOK = s.since(c.LastTransitionTime.Time)
	}
	switch {
	case !ok && !sinceOK:
		return 0
	case !ok:
		return since
	case !sinceOK:
		return s.now.Sub(started)
	}
	return min(s.now.Sub(started), since)
}

// lost fails a node NotReady for d, longer than notReadyTimeout, saying so
// and marking it to retry once Ready: once per step and driver version
// (AnnotationLost). Lost in the same step again on that version, it stays
// failed, counting towards maxFailures: a node that keeps going down in
// one step (a driver that crashes it, a drain that overloads it, a
// flapping kubelet) would otherwise hold its upgrade slot for ever.
func (s transition) lost(d time.Duration) (string, []action) {
	ready := "no Ready condition"
	if c := inventory.ReadyCondition(s.node); c != nil {
		ready = "Ready " + string(c.Status)
		if c.Reason != "" {
			ready += " (" + c.Reason + ")"
		}
	}
	why := fmt.Sprintf("node %s was NotReady for %s (%s) in %s, longer than %s", s.node.Name, d.Round(time.Second), ready, s.state(), notReadyTimeout)
	step := lossStep(s.state())
	if step == "driver" && s.driver != nil && s.driver.Annotations[gpuv1alpha1.AnnotationTemplateHash] == s.t.template {
		if why2 := podset.WaitingWhy(s.driver); why2 != "" {
			why += fmt.Sprintf("; its new driver pod %s: %s", s.driver.Name, why2)
		}
	}
	steps := s.lostIn()
	if slices.Contains(steps, step) {
		return s.fail(fmt.Sprintf("%s, the second time in its %s step on this driver version: it stays failed until a new driver version "+
			"(or its wanted driver runs ready after all)", why, step))
	}
	why += fmt.Sprintf(": its upgrade slot is freed, and it retries once Ready (once per step on this driver version: lost again in its %s step, it stays failed)", step)
	state, acts := s.fail(why)
	ann := acts[len(acts)-1].annotations
	ann[gpuv1alpha1.AnnotationFailedNotReady] = ptr.To("true")
	ann[gpuv1alpha1.AnnotationLost] = ptr.To(strings.Join(append(steps, step), ",") + ":" + s.t.template)
	return state, acts
}

// lostIn is the steps AnnotationLost says the node was lost in on the
// driver template it upgrades to; none for another template's, or a value
// that is not Loom's.
func (s transition) lostIn() []string {
	steps, template, ok := strings.Cut(s.node.Annotations[gpuv1alpha1.AnnotationLost], ":")
	if !ok || steps == "" || template != s.t.template {
		return nil
	}
	return strings.Split(steps, ",")
}

// lossStep names the step of state for AnnotationLost: the driver's
// restart and validation are one step, the driver.
func lossStep(state string) string {
	switch state {
	case gpuv1alpha1.UpgradeRequired:
		return "cordon"
	case gpuv1alpha1.PodRestartRequired, gpuv1alpha1.ValidationRequired:
		return "driver"
	}
	return strings.TrimSuffix(state, "-required")
}
