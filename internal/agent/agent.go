// Package agent is `loom-node-agent`: it reads its node's GPUs from the PCI
// bus (no driver needed) and through NVML, and publishes them as the status
// of the node's GPUNode, writing only when something changed. It never
// writes anything else.
//
// NVML may be missing (no driver yet) or go away (the driver unloaded for an
// upgrade): the agent then keeps the last inventory it read through NVML
// (from memory, or from the GPUNode after a restart) and the PCI presence,
// says so in the NVMLUnavailable and Ready conditions, shuts NVML down and
// initialises it again with backoff.
package agent

import (
	"context"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/inventory"
)

// The agent may read (and watch, for its own) and patch GPUNodes and their
// status, nothing else; the chart's ValidatingAdmissionPolicy narrows the
// writes to its own node's GPUNode.
// "create" is there because a server-side apply that creates an object is
// authorised as a create; the policy limits it to the agent's own node too.
// Patching the GPUNode itself is for removing the health-reset annotation.
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=gpunodes,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=gpu.loom.dev,resources=gpunodes/status,verbs=get;patch

// FieldOwner is the agent's server-side-apply field manager.
const FieldOwner = "loom-node-agent"

// Agent publishes one node's inventory.
type Agent struct {
	NodeName string
	Lib      nvml.Interface
	Client   client.Client
	Log      logr.Logger
	// Interval between collections (events trigger extra ones); also the
	// longest wait between two attempts to initialise NVML.
	Interval time.Duration
	// Simulated names the simulated system, empty on real hardware.
	Simulated string
	Metrics   *Metrics
	// SysfsRoot is where the PCI bus is read (/sys on a node); empty: PCI
	// is not read and presence comes from NVML alone.
	SysfsRoot string
	// BeforeCollect, when set, runs before each NVML collection (the
	// simulated MIG manager's reload); an error is logged.
	BeforeCollect func() error
	// Unprivileged: the agent's container is not privileged
	// (RunsUnprivileged), so NVML failing to initialise is reported as
	// Unprivileged, and a pass that publishes the PCI bus is a success.
	Unprivileged bool

	mu      sync.Mutex
	health  map[string]gpuv1alpha1.GPUHealth // unhealthy GPUs by UUID: events, checks, restored
	trigger chan struct{}
	w       *apply.Writer

	ctx  context.Context
	nvml nvmlSession
	srv  serverView

	kept *gpuv1alpha1.GPUNodeStatus // the last inventory read through NVML; nil: none
	pci  []gpuv1alpha1.PCIDevice    // the last PCI devices read
	cut  string                     // what bound cut, as logged last
}

// Run collects at start, on every Interval, on NVML events and when NVML
// is due for another initialisation, until ctx is done. Run shuts NVML down
// before it returns.
func (a *Agent) Run(ctx context.Context) error {
	a.ctx = ctx
	a.trigger = make(chan struct{}, 1)
	a.health = map[string]gpuv1alpha1.GPUHealth{}
	defer a.stopNVML()

	tick := time.NewTicker(a.Interval)
	defer tick.Stop()
	var seen <-chan *gpuv1alpha1.GPUNode
	if w, ok := a.Client.(client.WithWatch); ok {
		seen = a.watchGPUNode(ctx, w)
	}
	for passes := 1; ; passes++ {
		a.pass(ctx)
		if !a.wait(ctx, tick.C, seen, passes) {
			return nil
		}
	}
}

// wait returns when the next pass is due (false: ctx is done): on the
// interval, an NVML event, NVML due for another initialisation, or the
// GPUNode changed by someone else (deleted, or its status not what the
// agent wrote), which the pass then reads again.
func (a *Agent) wait(ctx context.Context, tick <-chan time.Time, seen <-chan *gpuv1alpha1.GPUNode, passes int) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			// Now and then compare with what the server holds rather than
			// with memory, so a GPUNode deleted or edited by someone else
			// comes back even without a watch: one GET per node every few
			// intervals.
			if passes%VerifyEvery == 0 {
				a.srv.known = false
			}
			return true
		case <-a.trigger:
			return true
		case <-a.nvmlRetry():
			return true
		case gn := <-seen:
			if a.strayed(gn) {
				a.srv.known = false
				return true
			}
		}
	}
}

// strayed reports whether gn, the GPUNode as the watch saw it last (nil:
// deleted), is not what the agent knows: deleted or made by someone else,
// its status not the one the agent wrote, a health reset asked for.
func (a *Agent) strayed(gn *gpuv1alpha1.GPUNode) bool {
	if gn == nil || !a.srv.exists {
		return (gn == nil) == a.srv.exists
	}
	return gn.Annotations[gpuv1alpha1.AnnotationResetGPUHealth] != a.srv.resetAsk ||
		!apiequality.Semantic.DeepEqual(gn.Status, a.srv.last)
}

// watchGPUNode watches the node's GPUNode and hands the run loop the
// latest version seen (nil: deleted), so that a GPUNode deleted or edited
// by someone else is put back at once rather than at the next
// verification. A watch that fails or ends is started again (1 s,
// doubling to the interval, while it fails); each start sees the GPUNode
// as it is.
func (a *Agent) watchGPUNode(ctx context.Context, c client.WithWatch) <-chan *gpuv1alpha1.GPUNode {
	out := make(chan *gpuv1alpha1.GPUNode, 1)
	go func() {
		backoff := time.Duration(0)
		for ctx.Err() == nil {
			w, err := c.Watch(ctx, &gpuv1alpha1.GPUNodeList{}, client.MatchingFields{"metadata.name": a.NodeName})
			if err != nil {
				backoff = min(max(2*backoff, time.Second), max(a.Interval, time.Second))
				a.Metrics.errors.WithLabelValues("read").Inc()
				a.Log.Error(err, "watching the GPUNode failed", "retryIn", backoff)
				select {
				case <-ctx.Done():
				case <-time.After(backoff):
				}
				continue
			}
			backoff = 0
			for ev := range w.ResultChan() {
				gn, _ := ev.Object.(*gpuv1alpha1.GPUNode)
				switch {
				case ev.Type == watch.Deleted:
					latest(out, nil)
				case (ev.Type == watch.Added || ev.Type == watch.Modified) && gn != nil:
					latest(out, gn)
				}
			}
			w.Stop()
		}
	}()
	return out
}

// latest puts gn in out (of capacity 1), replacing what the reader has
// not taken yet.
func latest(out chan *gpuv1alpha1.GPUNode, gn *gpuv1alpha1.GPUNode) {
	for {
		select {
		case out <- gn:
			return
		default:
			select {
			case <-out:
			default:
			}
		}
	}
}

// VerifyEvery is how many intervals pass between re-reads of the GPUNode.
const VerifyEvery = 5

// pass is one collection: read the GPUNode when needed, (re)initialise NVML
// when due, read PCI and NVML, publish what changed, finish a health reset.
func (a *Agent) pass(ctx context.Context) {
	if err := a.sync(ctx); err != nil {
		a.Metrics.errors.WithLabelValues("read").Inc()
		a.Log.Error(err, "reading the GPUNode failed")
		return
	}
	a.ensureNVML()
	pci := a.readPCI()
	fresh, collectErr := a.collect()
	if fresh != nil {
		a.kept = fresh
	}
	desired := composeStatus(statusInput{
		last: a.srv.last, inventory: a.kept, pci: pci, health: a.records(), down: a.nvml.down,
		collectErr: collectErr, simulated: a.Simulated,
	})
	a.logCut(desired)
	if err := a.publish(ctx, &desired); err != nil {
		a.Metrics.errors.WithLabelValues("write").Inc()
		a.Log.Error(err, "writing the GPUNode status failed")
		return
	}
	// Unprivileged, the PCI bus is all the agent can read: publishing it
	// is its collection, so that an agent that stops is still told.
	if fresh != nil || a.nvml.down != nil && a.nvml.down.reason == gpuv1alpha1.ReasonUnprivileged {
		a.Metrics.lastSuccess.SetToCurrentTime()
	}
	a.finishReset(ctx)
}

// logCut logs what the status was cut to fit its schema, when that
// changes.
func (a *Agent) logCut(st gpuv1alpha1.GPUNodeStatus) {
	var cut string
	c := meta.FindStatusCondition(st.Conditions, gpuv1alpha1.ConditionTruncated)
	if c != nil {
		cut = c.Message
	}
	if cut != a.cut && c != nil {
		a.Log.Info("the node reports more than the GPUNode status admits; writing what fits", "reason", c.Reason, "cut", cut)
	}
	a.cut = cut
}

// readPCI reads the PCI bus; on failure it logs and keeps what it read
// last (or restored from the GPUNode).
func (a *Agent) readPCI() []gpuv1alpha1.PCIDevice {
	if a.SysfsRoot == "" {
		return a.pci
	}
	devs, err := inventory.ReadPCI(a.SysfsRoot)
	if err != nil {
		a.Metrics.errors.WithLabelValues("pci").Inc()
		a.Log.Error(err, "reading the PCI bus", "sysfsRoot", a.SysfsRoot)
		if devs == nil {
			return a.pci
		}
	}
	a.pci = devs
	return devs
}

// collect reads the inventory through NVML when it is up. NVML failing as a
// missing driver does ends the NVML session (nothing collected, a.nvml.down
// says why); any other failure is returned as the collection's error.
func (a *Agent) collect() (*gpuv1alpha1.GPUNodeStatus, string) {
	if !a.nvml.up {
		return nil, ""
	}
	if a.BeforeCollect != nil {
		if err := a.BeforeCollect(); err != nil {
			a.Log.Error(err, "before collecting")
		}
	}
	start := time.Now()
	st, err := collect.Collect(a.Lib, nil)
	a.Metrics.duration.Observe(time.Since(start).Seconds())
	if err == nil {
		if a.kept != nil {
			knownAs(st.GPUs, a.kept.GPUs)
		}
		a.updateHealth(st.GPUs)
		st.Driver = a.driver()
		return &st, ""
	}
	a.Metrics.errors.WithLabelValues("collect").Inc()
	if nvmlGone(err) {
		a.loseNVML(err)
		return nil, ""
	}
	a.Log.Error(err, "collecting the GPU inventory failed")
	return nil, err.Error()
}

// driver is where the driver NVML was loaded from comes from, nil when the
// library cannot tell (DriverLibrary can; a simulation cannot).
func (a *Agent) driver() *gpuv1alpha1.GPUDriver {
	l, ok := a.Lib.(interface {
		Source() gpuv1alpha1.DriverSource
	})
	if !ok || l.Source() == "" {
		return nil
	}
	return &gpuv1alpha1.GPUDriver{Source: l.Source()}
}

// knownAs gives a GPU NVML could not read (its UUID unknown: fallen off the
// bus) what the last inventory knew of the GPU at its index, so that it
// keeps its name, product and labels while it is listed unhealthy.
func knownAs(gpus, last []gpuv1alpha1.GPU) {
	for i := range gpus {
		g := &gpus[i]
		if g.UUID != "" {
			continue
		}
		for _, k := range last {
			if k.Index == g.Index {
				health := g.Health
				*g = *k.DeepCopy()
				g.Health = health
				break
			}
		}
	}
}

// writer is the agent's one writer: its GPUNode and that GPUNode's status,
// with the conditions the agent owns.
func (a *Agent) writer() *apply.Writer {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.w == nil {
		a.w = apply.NewWriter(a.Client, FieldOwner, apply.Options{
			Conditions: []string{gpuv1alpha1.ConditionReady, gpuv1alpha1.ConditionNVMLUnavailable,
				gpuv1alpha1.ConditionReconciling, gpuv1alpha1.ConditionStalled, gpuv1alpha1.ConditionTruncated}})
	}
	return a.w
}
