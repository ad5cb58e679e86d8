// Package agent is `loom node-agent`: it reads its node's GPUs through NVML
// and publishes them as the status of the node's GPUNode, writing only when
// something changed. It never writes anything else.
package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
)

// The agent may read and patch GPUNodes and their status, nothing else; the
// chart's ValidatingAdmissionPolicy narrows that to its own node's GPUNode.
// "create" is there because a server-side apply that creates an object is
// authorised as a create; the policy limits it to the agent's own node too.
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=gpunodes,verbs=get;create;patch
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=gpunodes/status,verbs=get;patch

// FieldOwner is the agent's server-side-apply field manager.
const FieldOwner = "loom-node-agent"

// Agent publishes one node's inventory.
type Agent struct {
	NodeName string
	Lib      nvml.Interface
	Client   client.Client
	Log      logr.Logger
	// Interval between collections (events trigger extra ones).
	Interval time.Duration
	// Simulated names the simulated system, empty on real hardware.
	Simulated string
	Metrics   *Metrics

	mu      sync.Mutex
	health  map[string]gpuv1alpha1.GPUHealth
	last    *gpuv1alpha1.GPUNodeStatus // what the server holds, as far as we know
	trigger chan struct{}
	w       *apply.Writer
}

// Run collects at start, on every Interval and on NVML events, until ctx is
// done. NVML failing to initialise is reported on the GPUNode and retried
// with backoff; Run shuts NVML down before it returns.
func (a *Agent) Run(ctx context.Context) error {
	a.trigger = make(chan struct{}, 1)
	a.health = map[string]gpuv1alpha1.GPUHealth{}
	backoff := time.Second
	for {
		ret := a.Lib.Init()
		if ret == nvml.SUCCESS {
			break
		}
		msg := nvml.ErrorString(ret)
		a.Log.Error(errors.New(msg), "NVML is unavailable; retrying", "retryIn", backoff)
		a.Metrics.errors.WithLabelValues("nvml_init").Inc()
		if err := a.publish(ctx, nil, &gpuv1alpha1.GPUNodeStatus{}, unavailable(msg)); err != nil {
			a.Log.Error(err, "cannot report NVML unavailability")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, a.Interval)
	}
	defer func() {
		if ret := a.Lib.Shutdown(); ret != nvml.SUCCESS {
			a.Log.Error(errors.New(nvml.ErrorString(ret)), "NVML shutdown")
		}
	}()

	events := make(chan struct{})
	go func() { defer close(events); a.watchEvents(ctx) }()
	defer func() { <-events }()

	tick := time.NewTicker(a.Interval)
	defer tick.Stop()
	for ticks := 1; ; ticks++ {
		a.collectAndPublish(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			// Now and then compare with what the server holds rather than
			// with memory, so a GPUNode deleted or edited by someone else
			// comes back: one GET per node every few intervals.
			if ticks%VerifyEvery == 0 {
				a.last = nil
			}
		case <-a.trigger:
		}
	}
}

// VerifyEvery is how many intervals pass between re-reads of the GPUNode.
const VerifyEvery = 5

func (a *Agent) collectAndPublish(ctx context.Context) {
	start := time.Now()
	a.mu.Lock()
	health := make(map[string]gpuv1alpha1.GPUHealth, len(a.health))
	for k, v := range a.health {
		health[k] = v
	}
	a.mu.Unlock()
	st, err := inventory.Collect(a.Lib, health)
	a.Metrics.duration.Observe(time.Since(start).Seconds())
	if err != nil {
		a.Metrics.errors.WithLabelValues("collect").Inc()
		a.Log.Error(err, "collecting the GPU inventory failed")
		if perr := a.publish(ctx, nil, a.lastOrEmpty(), collectionFailed(err.Error())); perr != nil {
			a.Log.Error(perr, "cannot report the collection failure")
		}
		return
	}
	if err := a.publish(ctx, &st, &st, ready(st)); err != nil {
		a.Metrics.errors.WithLabelValues("write").Inc()
		a.Log.Error(err, "writing the GPUNode status failed")
		return
	}
	a.Metrics.lastSuccess.SetToCurrentTime()
}

func (a *Agent) lastOrEmpty() *gpuv1alpha1.GPUNodeStatus {
	if a.last != nil {
		return a.last.DeepCopy()
	}
	return &gpuv1alpha1.GPUNodeStatus{}
}

// publish writes status (with the given conditions) unless the server
// already holds exactly that. collected is nil when nothing was collected:
// the GPU list then stays as it was.
func (a *Agent) publish(ctx context.Context, collected, base *gpuv1alpha1.GPUNodeStatus, conds []metav1.Condition) error {
	if a.last == nil {
		cur := &gpuv1alpha1.GPUNode{}
		err := a.Client.Get(ctx, client.ObjectKey{Name: a.NodeName}, cur)
		switch {
		case apierrors.IsNotFound(err):
			if err := a.create(ctx); err != nil {
				return err
			}
			a.last = &gpuv1alpha1.GPUNodeStatus{}
		case err != nil:
			return fmt.Errorf("reading GPUNode %s: %w", a.NodeName, err)
		default:
			a.last = cur.Status.DeepCopy()
		}
	}
	desired := base.DeepCopy()
	if collected == nil {
		desired.GPUs = a.last.GPUs
		inventory.Summarize(desired)
	}
	desired.Simulated = a.Simulated
	desired.Conditions = append([]metav1.Condition(nil), a.last.Conditions...)
	for _, c := range conds {
		meta.SetStatusCondition(&desired.Conditions, c)
	}
	if apiequality.Semantic.DeepEqual(desired, a.last) {
		return nil
	}
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: a.NodeName}}
	if _, err := a.writer().Status(ctx, gn, a.last, desired); err != nil {
		a.last = nil // re-read before the next write
		return fmt.Errorf("GPUNode %s: %w", a.NodeName, err)
	}
	a.Metrics.writes.Inc()
	a.Log.Info("published GPU inventory", "gpus", desired.GPUCount, "product", desired.Product, "mig", desired.MIG)
	a.last = desired
	return nil
}

// create makes the (empty) GPUNode so that its status can be applied. The
// manager adds the owner reference to the Node.
func (a *Agent) create(ctx context.Context) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(gpuv1alpha1.GroupVersion.String())
	u.SetKind("GPUNode")
	u.SetName(a.NodeName)
	if err := a.writer().ApplyFields(ctx, u, false, "GPUNode missing"); err != nil {
		return err
	}
	a.Metrics.writes.Inc()
	return nil
}

// writer is the agent's one writer: its GPUNode and that GPUNode's status,
// with the two conditions the agent owns.
func (a *Agent) writer() *apply.Writer {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.w == nil {
		a.w = apply.NewWriter(a.Client, FieldOwner, apply.Options{
			Conditions: []string{gpuv1alpha1.ConditionReady, gpuv1alpha1.ConditionNVMLUnavailable}})
	}
	return a.w
}

func ready(st gpuv1alpha1.GPUNodeStatus) []metav1.Condition {
	r := metav1.Condition{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: gpuv1alpha1.ReasonCollected,
		Message: fmt.Sprintf("%d GPUs read through NVML", st.GPUCount)}
	var bad []string
	for _, g := range st.GPUs {
		if g.Health.State == gpuv1alpha1.GPUUnhealthy {
			bad = append(bad, fmt.Sprintf("GPU %d (%s): %s", g.Index, g.Health.Reason, g.Health.Message))
		}
	}
	if len(bad) > 0 {
		r.Status, r.Reason = metav1.ConditionFalse, gpuv1alpha1.ReasonUnhealthyGPUs
		r.Message = fmt.Sprintf("%d of %d GPUs unhealthy: %v", len(bad), st.GPUCount, bad)
	}
	return []metav1.Condition{r, {Type: gpuv1alpha1.ConditionNVMLUnavailable, Status: metav1.ConditionFalse,
		Reason: gpuv1alpha1.ReasonNVMLAvailable, Message: "NVML initialised"}}
}

func unavailable(nvmlMessage string) []metav1.Condition {
	return []metav1.Condition{
		{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: gpuv1alpha1.ReasonNVMLInitFailed,
			Message: "NVML could not be initialised: " + nvmlMessage},
		{Type: gpuv1alpha1.ConditionNVMLUnavailable, Status: metav1.ConditionTrue, Reason: gpuv1alpha1.ReasonNVMLInitFailed,
			Message: nvmlMessage},
	}
}

func collectionFailed(msg string) []metav1.Condition {
	return []metav1.Condition{{Type: gpuv1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: gpuv1alpha1.ReasonCollectionFailed, Message: msg}}
}
