package agent

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
)

func injectXid(t *testing.T, s *collect.Simulator, gpu int, xid uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !s.InjectXid(gpu, xid) {
		if time.Now().After(deadline) {
			t.Fatal("agent never registered for Xid events")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func gpuHealth(gn *gpuv1alpha1.GPUNode, i int) gpuv1alpha1.GPUHealth {
	if i >= len(gn.Status.GPUs) {
		return gpuv1alpha1.GPUHealth{}
	}
	return gn.Status.GPUs[i].Health
}

// An Xid-79 GPU is still unhealthy after the agent restarts, until a person
// resets it with the annotation, which the agent then removes.
func TestAgentHealthSurvivesRestartUntilReset(t *testing.T) {
	const node = "agent-xid-restart"
	s := sim(t, collect.SimOptions{System: "dgx-h100", Seed: node})
	r := start(t, node, s, "dgx-h100")
	waitFor(t, node, "Ready", isReady)
	injectXid(t, s, 3, 79)
	before := waitFor(t, node, "GPU 3 unhealthy", func(gn *gpuv1alpha1.GPUNode) bool {
		return gpuHealth(gn, 3).State == gpuv1alpha1.GPUUnhealthy
	})
	h := gpuHealth(before, 3)
	if h.Xid != 79 || h.Reason != gpuv1alpha1.HealthXidCriticalError || h.Message != "Xid 79: GPU has fallen off the bus" || h.Since == nil {
		t.Fatalf("GPU 3 health = %+v", h)
	}
	r.stop()

	r2 := start(t, node, sim(t, collect.SimOptions{System: "dgx-h100", Seed: node}), "dgx-h100")
	time.Sleep(time.Second) // its first pass
	after := waitFor(t, node, "read", func(*gpuv1alpha1.GPUNode) bool { return true })
	if got := gpuHealth(after, 3); got.State != gpuv1alpha1.GPUUnhealthy || got.Xid != 79 || !got.Since.Equal(h.Since) {
		t.Fatalf("after a restart GPU 3 health = %+v, want %+v", got, h)
	}
	if isReady(after) {
		t.Error("Ready with an unhealthy GPU")
	}

	patch := client.MergeFrom(after.DeepCopy())
	after.Annotations = map[string]string{gpuv1alpha1.AnnotationResetGPUHealth: after.Status.GPUs[3].UUID}
	if err := env.Client.Patch(context.Background(), after, patch); err != nil {
		t.Fatal(err)
	}
	r2.agent.collectNow()
	gn := waitFor(t, node, "GPU 3 reset and the annotation gone", func(gn *gpuv1alpha1.GPUNode) bool {
		_, asked := gn.Annotations[gpuv1alpha1.AnnotationResetGPUHealth]
		return gpuHealth(gn, 3).State == gpuv1alpha1.GPUHealthy && !asked
	})
	if !isReady(gn) || gpuHealth(gn, 3).Since != nil {
		t.Errorf("after the reset: %+v", gn.Status)
	}
}

// A pending row remap makes a GPU unhealthy; it clears when NVML no longer
// reports it (the reset that applies it). Double-bit ECC counts stay.
func TestAgentRowRemapAndDoubleBitECC(t *testing.T) {
	const node = "agent-remap"
	s := sim(t, collect.SimOptions{System: "dgx-a100", Seed: node})
	r := start(t, node, s, "dgx-a100")
	waitFor(t, node, "Ready", isReady)
	s.InjectRowRemapPending(1, true)
	s.InjectDoubleBitECC(6, 2)
	r.agent.collectNow()
	gn := waitFor(t, node, "GPUs 1 and 6 unhealthy", func(gn *gpuv1alpha1.GPUNode) bool {
		return gpuHealth(gn, 1).State == gpuv1alpha1.GPUUnhealthy && gpuHealth(gn, 6).State == gpuv1alpha1.GPUUnhealthy
	})
	if gpuHealth(gn, 1).Reason != gpuv1alpha1.HealthRowRemapPending || gpuHealth(gn, 6).Reason != gpuv1alpha1.HealthDoubleBitECC {
		t.Errorf("health %+v / %+v", gpuHealth(gn, 1), gpuHealth(gn, 6))
	}
	s.InjectRowRemapPending(1, false)
	s.InjectDoubleBitECC(6, 0)
	r.agent.collectNow()
	gn = waitFor(t, node, "GPU 1 healthy again", func(gn *gpuv1alpha1.GPUNode) bool {
		return gpuHealth(gn, 1).State == gpuv1alpha1.GPUHealthy
	})
	if gpuHealth(gn, 6).State != gpuv1alpha1.GPUUnhealthy {
		t.Errorf("double-bit ECC cleared without a reset: %+v", gpuHealth(gn, 6))
	}
}

func TestMergeHealth(t *testing.T) {
	now := metav1.Now().Rfc3339Copy()
	old := metav1.NewTime(now.Add(-time.Hour)).Rfc3339Copy()
	unhealthy := func(reason string, since *metav1.Time) gpuv1alpha1.GPUHealth {
		return gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUUnhealthy, Reason: reason, Since: since}
	}
	healthy := gpuv1alpha1.GPUHealth{State: gpuv1alpha1.GPUHealthy}
	records := map[string]gpuv1alpha1.GPUHealth{
		"xid":   unhealthy(gpuv1alpha1.HealthXidCriticalError, &old),
		"remap": unhealthy(gpuv1alpha1.HealthRowRemapPending, &old),
		"gone":  unhealthy(gpuv1alpha1.HealthXidCriticalError, &old),
		"still": unhealthy(gpuv1alpha1.HealthRowRemapPending, &old),
	}
	gpus := []gpuv1alpha1.GPU{
		{UUID: "xid", Health: healthy},
		{UUID: "remap", Health: healthy},
		{UUID: "still", Health: unhealthy(gpuv1alpha1.HealthRowRemapPending, nil)},
		{UUID: "new", Health: unhealthy(gpuv1alpha1.HealthDoubleBitECC, nil)},
		{UUID: "fine", Health: healthy},
	}
	got := mergeHealth(records, gpus, now)
	if len(got) != 3 || !got["xid"].Since.Equal(&old) || !got["still"].Since.Equal(&old) || !got["new"].Since.Equal(&now) {
		t.Errorf("merged = %+v", got)
	}
}
