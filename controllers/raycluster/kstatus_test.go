package raycluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	"github.com/loom-dev/loom/internal/podset"
	"github.com/loom-dev/loom/internal/testenv"
)

// kstatusOf is what cli-utils' kstatus (Helm's --wait, Flux) reads from
// the cluster.
func kstatusOf(t *testing.T, rc *rayv1.RayCluster) kstatus.Status {
	return testenv.KStatus(t, rc, rayv1.GroupVersion.WithKind("RayCluster"))
}

// readyPods are the sample cluster's head and worker, running and ready.
func readyPods(ctx context.Context, rc *rayv1.RayCluster) []*corev1.Pod {
	head := buildHeadPod(ctx, rc, "")
	w := buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[0], "")
	for i, p := range []*corev1.Pod{head, w} {
		p.Name, p.UID = fmt.Sprintf("p%d", i), types.UID(fmt.Sprintf("u%d", i))
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	return []*corev1.Pod{head, w}
}

// kstatus reads a cluster whose pods all run and are ready Current, one
// provisioning, rolling out or suspending InProgress, one Loom refuses
// Failed, and a spec not seen yet InProgress.
func TestKstatus(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		setup func(rc *rayv1.RayCluster, obs *observed) string
		want  kstatus.Status
	}{
		{"provisioning", func(_ *rayv1.RayCluster, obs *observed) string { obs.pods = nil; return "none" }, kstatus.InProgressStatus},
		{"head not ready", func(_ *rayv1.RayCluster, obs *observed) string {
			obs.pods[0].Status.Conditions = nil
			return "none"
		}, kstatus.InProgressStatus},
		{"ready", func(*rayv1.RayCluster, *observed) string { return "none" }, kstatus.CurrentStatus},
		{"rolling out a changed template", func(rc *rayv1.RayCluster, _ *observed) string {
			rc.Spec.WorkerGroupSpecs[0].Template.Labels = map[string]string{"changed": "yes"}
			return "none"
		}, kstatus.InProgressStatus},
		{"scaling up", func(rc *rayv1.RayCluster, _ *observed) string {
			rc.Spec.WorkerGroupSpecs[0].Replicas = ptr.To(int32(2))
			return "none"
		}, kstatus.InProgressStatus},
		{"suspending", func(rc *rayv1.RayCluster, _ *observed) string { rc.Spec.Suspend = ptr.To(true); return "none" }, kstatus.InProgressStatus},
		{"invalid spec", func(rc *rayv1.RayCluster, _ *observed) string {
			rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, rc.Spec.WorkerGroupSpecs[0])
			return "none"
		}, kstatus.FailedStatus},
		{"too many pods", func(_ *rayv1.RayCluster, obs *observed) string { obs.maxPods = 1; return "none" }, kstatus.FailedStatus},
		{"volcano missing", func(_ *rayv1.RayCluster, obs *observed) string { obs.pods = nil; return "volcano" }, kstatus.FailedStatus},
		{"volcano missing, auto", func(_ *rayv1.RayCluster, obs *observed) string {
			obs.autoGang = true
			return "volcano"
		}, kstatus.CurrentStatus},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
			rc.UID, rc.Generation = "u1", 2
			obs := observed{pods: readyPods(ctx, rc), now: time.Now()}
			sched := tt.setup(rc, &obs)
			d := decide(ctx, rc, obs, sched)
			rc.Status = d.status
			if got := kstatusOf(t, rc); got != tt.want {
				t.Fatalf("kstatus %s, want %s (state %q, conditions %+v)", got, tt.want, d.status.State, d.status.Conditions)
			}
			rc.Generation++
			if got := kstatusOf(t, rc); got != kstatus.InProgressStatus {
				t.Fatalf("kstatus of an unobserved generation %s, want InProgress", got)
			}
		})
	}
}

// A suspended cluster has no pods and nothing left to do: not ready, not
// reconciling. A failed apply is retried (InProgress); a name taken by an
// object the cluster does not control waits for a person (Failed).
func TestKstatusSuspendedAndApplied(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID, rc.Spec.Suspend = "u1", ptr.To(true)
	rc.Status = decide(ctx, rc, observed{now: time.Now()}, "none").status
	if got := kstatusOf(t, rc); got != kstatus.InProgressStatus || isTrue(rc, ConditionReconciling) || isTrue(rc, ConditionReady) || isTrue(rc, ConditionStalled) {
		t.Fatalf("suspended: %s, conditions %+v", got, rc.Status.Conditions)
	}
	rc.Spec.Suspend = nil
	obs := observed{pods: readyPods(ctx, rc), now: time.Now()}
	rc.Status = decide(ctx, rc, obs, "none").status
	applied(&rc.Status, errors.New("deleting pod x: forbidden"), nil, rc.Generation, obs.now)
	if got := kstatusOf(t, rc); got != kstatus.InProgressStatus {
		t.Fatalf("after a failed apply: %s", got)
	}
	applied(&rc.Status, fmt.Errorf("creating pod x: %w", &podset.ConflictError{Namespace: "unit", Pod: "x", Owner: rc.Name}), nil, rc.Generation, obs.now)
	if got := kstatusOf(t, rc); got != kstatus.FailedStatus {
		t.Fatalf("after a name conflict: %s", got)
	}
}

func isTrue(rc *rayv1.RayCluster, t string) bool {
	for _, c := range rc.Status.Conditions {
		if c.Type == t {
			return c.Status == "True"
		}
	}
	return false
}
