package training

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
)

// BenchmarkDecideRunningGang is one pass over a running gang of 1 master +
// 511 workers: the pass each burst of its pods' events brings (created,
// bound, started), a few hundred of them while a gang starts.
func BenchmarkDecideRunningGang(b *testing.B) {
	job := newJob("ns", "big", 511, 1, trainingv1alpha1.GangNone)
	job.UID = "big-uid"
	var pods []*corev1.Pod
	for _, role := range roles {
		for i := range replicas(job, role) {
			p := buildPod(job, pytorch{}, role, i, 0, trainingv1alpha1.GangNone)
			p.Status.Phase = corev1.PodRunning
			pods = append(pods, p)
		}
	}
	obs := observed{pods: pods, now: time.Now()}
	job.Status = decide(job, obs, trainingv1alpha1.GangNone).status
	if d := decide(job, obs, trainingv1alpha1.GangNone); len(d.create) != 0 || len(d.remove) != 0 || d.status.ReplicaStatuses.Worker.Active != 511 {
		b.Fatalf("not a steady running gang: create %d remove %d workers active %d", len(d.create), len(d.remove), d.status.ReplicaStatuses.Worker.Active)
	}
	b.ReportAllocs()
	for b.Loop() {
		decide(job, obs, trainingv1alpha1.GangNone)
	}
}
