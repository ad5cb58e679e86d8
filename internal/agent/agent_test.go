package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

type running struct {
	agent  *Agent
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, node string, lib nvml.Interface, sim string) *running {
	t.Helper()
	return startAgent(t, &Agent{NodeName: node, Lib: lib, Simulated: sim})
}

// startAgent runs a (with the test's client, log and metrics, and an hour's
// interval unless set) until the test ends.
func startAgent(t *testing.T, a *Agent) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a.Log, a.Metrics = ctrl.Log.WithName(a.NodeName), NewMetrics()
	if a.Client == nil {
		a.Client = env.Client
	}
	if a.Interval == 0 {
		a.Interval = time.Hour
	}
	r := &running{agent: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *running) stop() {
	r.cancel()
	if err := <-r.done; err != nil {
		r.agent.Log.Error(err, "agent stopped")
	}
	r.done <- nil // later stops return at once
}

func waitFor(t *testing.T, name string, what string, cond func(*gpuv1alpha1.GPUNode) bool) *gpuv1alpha1.GPUNode {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		gn := &gpuv1alpha1.GPUNode{}
		err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, gn)
		if err == nil && cond(gn) {
			return gn
		}
		if time.Now().After(deadline) {
			t.Fatalf("GPUNode %s: %s not reached (err %v, status %+v)", name, what, err, gn.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sim(t *testing.T, o collect.SimOptions) *collect.Simulator {
	t.Helper()
	s, err := collect.Simulate(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAgentPublishesAndRestartWritesNothing(t *testing.T) {
	const node = "agent-h100"
	r := start(t, node, sim(t, collect.SimOptions{System: "dgx-h100", Seed: node}), "dgx-h100")
	gn := waitFor(t, node, "Ready with 8 GPUs", func(gn *gpuv1alpha1.GPUNode) bool {
		return meta.IsStatusConditionTrue(gn.Status.Conditions, gpuv1alpha1.ConditionReady) && gn.Status.GPUCount == 8
	})
	if gn.Status.Product != "NVIDIA H100 80GB HBM3" || gn.Status.Simulated != "dgx-h100" || gn.Status.DriverVersion == "" {
		t.Fatalf("status = %+v", gn.Status)
	}
	if c := meta.FindStatusCondition(gn.Status.Conditions, gpuv1alpha1.ConditionNVMLUnavailable); c == nil || c.Status != "False" {
		t.Fatalf("NVMLUnavailable = %+v", c)
	}
	// Creating the object and its first status: two writes. The agent
	// counts a write once its response is back, which may be after the
	// status is readable here.
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(r.agent.Metrics.writes) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if w := testutil.ToFloat64(r.agent.Metrics.writes); w != 2 {
		t.Errorf("first run wrote %v times, want 2", w)
	}
	// A second collection with nothing changed writes nothing.
	r.agent.trigger <- struct{}{}
	time.Sleep(300 * time.Millisecond)
	if w := testutil.ToFloat64(r.agent.Metrics.writes); w != 2 {
		t.Errorf("an unchanged collection wrote (%v writes)", w)
	}
	r.stop()

	// A restarted agent with the same GPUs reads once and writes nothing.
	rv := gn.ResourceVersion
	r2 := start(t, node, sim(t, collect.SimOptions{System: "dgx-h100", Seed: node}), "dgx-h100")
	time.Sleep(time.Second)
	if w := testutil.ToFloat64(r2.agent.Metrics.writes); w != 0 {
		t.Errorf("restart with unchanged GPUs wrote %v times", w)
	}
	after := &gpuv1alpha1.GPUNode{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != rv {
		t.Errorf("resourceVersion changed from %s to %s across a restart", rv, after.ResourceVersion)
	}
}

func TestAgentMarksGPUUnhealthyOnXid(t *testing.T) {
	const node = "agent-xid"
	s := sim(t, collect.SimOptions{System: "dgx-a100", Seed: node})
	start(t, node, s, "dgx-a100")
	waitFor(t, node, "Ready", func(gn *gpuv1alpha1.GPUNode) bool {
		return meta.IsStatusConditionTrue(gn.Status.Conditions, gpuv1alpha1.ConditionReady)
	})
	deadline := time.Now().Add(10 * time.Second)
	for !s.InjectXid(2, 13) || !s.InjectXid(5, 79) {
		if time.Now().After(deadline) {
			t.Fatal("agent never registered for Xid events")
		}
		time.Sleep(50 * time.Millisecond)
	}
	gn := waitFor(t, node, "GPU 5 unhealthy", func(gn *gpuv1alpha1.GPUNode) bool {
		return len(gn.Status.GPUs) == 8 && gn.Status.GPUs[5].Health.State == gpuv1alpha1.GPUUnhealthy
	})
	if h := gn.Status.GPUs[5].Health; h.Xid != 79 || h.Reason != "XidCriticalError" {
		t.Errorf("GPU 5 health = %+v", h)
	}
	if h := gn.Status.GPUs[2].Health; h.State != gpuv1alpha1.GPUHealthy {
		t.Errorf("application Xid 13 made GPU 2 %+v", h)
	}
	c := meta.FindStatusCondition(gn.Status.Conditions, gpuv1alpha1.ConditionReady)
	if c == nil || c.Status != "False" || c.Reason != gpuv1alpha1.ReasonUnhealthyGPUs || !strings.Contains(c.Message, "Xid 79") {
		t.Errorf("Ready = %+v", c)
	}
}

// A node with GPUs on the PCI bus and no driver: the GPUNode lists the PCI
// devices and says NVML is unavailable.
func TestAgentReportsNVMLUnavailable(t *testing.T) {
	const node = "agent-no-driver"
	lib := dgxh100.New()
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	startAgent(t, &Agent{NodeName: node, Lib: lib, SysfsRoot: pciTree(t, 2)})
	gn := waitFor(t, node, "NVMLUnavailable", func(gn *gpuv1alpha1.GPUNode) bool {
		return meta.IsStatusConditionTrue(gn.Status.Conditions, gpuv1alpha1.ConditionNVMLUnavailable)
	})
	c := meta.FindStatusCondition(gn.Status.Conditions, gpuv1alpha1.ConditionNVMLUnavailable)
	if c.Message != nvml.ErrorString(nvml.ERROR_DRIVER_NOT_LOADED) || c.Reason != gpuv1alpha1.ReasonNVMLInitFailed {
		t.Errorf("condition = %+v", c)
	}
	if meta.IsStatusConditionTrue(gn.Status.Conditions, gpuv1alpha1.ConditionReady) {
		t.Error("Ready while NVML is unavailable")
	}
	if p := gn.Status.PCIDevices; len(p) != 2 || p[0].BusID != "0000:00:00.0" || p[1].DeviceID != "0x2330" ||
		p[1].Product != "NVIDIA H100 80GB HBM3" || gn.Status.GPUCount != 0 {
		t.Errorf("PCI devices %+v, %d GPUs", p, gn.Status.GPUCount)
	}
}

// pciTree fabricates a sysfs tree with n H100s.
func pciTree(t *testing.T, n int) string {
	t.Helper()
	root := t.TempDir()
	var devs []gpuv1alpha1.PCIDevice
	for i := range n {
		devs = append(devs, gpuv1alpha1.PCIDevice{BusID: fmt.Sprintf("0000:%02x:00.0", i), DeviceID: "0x2330"})
	}
	if err := inventory.WritePCITree(root, devs); err != nil {
		t.Fatal(err)
	}
	return root
}

// A GPUNode deleted behind the agent's back comes back within VerifyEvery
// intervals.
func TestAgentRestoresADeletedGPUNode(t *testing.T) {
	const node = "agent-restore"
	ctx, cancel := context.WithCancel(context.Background())
	a := &Agent{NodeName: node, Lib: sim(t, collect.SimOptions{System: "dgx-h200", Seed: node}), Client: env.Client,
		Log: ctrl.Log.WithName(node), Interval: 200 * time.Millisecond, Metrics: NewMetrics()}
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	gn := waitFor(t, node, "published", func(gn *gpuv1alpha1.GPUNode) bool { return gn.Status.GPUCount == 8 })
	if err := env.Client.Delete(context.Background(), gn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, node, "re-created with its inventory", func(g *gpuv1alpha1.GPUNode) bool {
		return g.UID != gn.UID && g.Status.GPUCount == 8
	})
}

// With a watch, a GPUNode a person edits or deletes is put back at once,
// not at the next verification (an hour here), with one write each (two
// for a delete: the GPUNode, then its status), and the agent's own writes
// seen through the watch write nothing more.
func TestAgentWatchPutsBackAnEditedOrDeletedGPUNode(t *testing.T) {
	const node = "agent-watch"
	ctx := context.Background()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	s := sim(t, collect.SimOptions{System: "dgx-h100", Seed: node})
	r := startAgent(t, &Agent{NodeName: node, Client: c, Lib: s, Simulated: "dgx-h100"})
	gn := waitFor(t, node, "Ready", isReady)
	waitWrites(t, r, 2)
	time.Sleep(500 * time.Millisecond) // the watch sees the agent's own writes
	if w := testutil.ToFloat64(r.agent.Metrics.writes); w != 2 {
		t.Fatalf("the agent's own writes, seen through its watch, made it write again: %v writes, want 2", w)
	}

	// A person edits the status: put back.
	gn.Status.GPUCount, gn.Status.Product = 2, "edited"
	if err := env.Client.Status().Update(ctx, gn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, node, "the edit undone", func(gn *gpuv1alpha1.GPUNode) bool {
		return gn.Status.GPUCount == 8 && gn.Status.Product == "NVIDIA H100 80GB HBM3"
	})
	waitWrites(t, r, 3)

	// A person deletes it: made again.
	if err := env.Client.Delete(ctx, gn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, node, "made again with its inventory", func(g *gpuv1alpha1.GPUNode) bool {
		return g.UID != gn.UID && isReady(g) && g.Status.GPUCount == 8
	})
	waitWrites(t, r, 5)
	time.Sleep(500 * time.Millisecond)
	if w := testutil.ToFloat64(r.agent.Metrics.writes); w != 5 {
		t.Errorf("%v writes, want 5: two to publish, one to undo the edit, two to make the GPUNode again", w)
	}

	// A person asks for a health reset: done at once, not at the next pass.
	injectXid(t, s, 3, 79)
	gn = waitFor(t, node, "GPU 3 unhealthy", func(gn *gpuv1alpha1.GPUNode) bool {
		return gpuHealth(gn, 3).State == gpuv1alpha1.GPUUnhealthy
	})
	patch := client.MergeFrom(gn.DeepCopy())
	gn.Annotations = map[string]string{gpuv1alpha1.AnnotationResetGPUHealth: "all"}
	if err := env.Client.Patch(ctx, gn, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, node, "GPU 3 reset and the annotation gone", func(gn *gpuv1alpha1.GPUNode) bool {
		_, asked := gn.Annotations[gpuv1alpha1.AnnotationResetGPUHealth]
		return gpuHealth(gn, 3).State == gpuv1alpha1.GPUHealthy && !asked
	})
}
