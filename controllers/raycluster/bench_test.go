package raycluster

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/loom-dev/loom/internal/testenv"
)

// BenchmarkDecide is one pass over a KubeRay sample cluster (a head and a
// worker group): "steady" with all its pods there, "create" from none.
// Every pass builds the pod of each group once, through KubeRay's
// builders, for the template stamp; a creating pass copies it.
func BenchmarkDecide(b *testing.B) {
	ctx := context.Background()
	rc, err := testenv.KubeRaySample("ray-cluster.sample.yaml", "bench")
	if err != nil {
		b.Fatal(err)
	}
	rc = normalized(rc)
	rc.UID = "u1"
	first := decide(ctx, rc, observed{now: time.Now()}, "none")
	pods := make([]*corev1.Pod, len(first.create))
	for i, p := range first.create {
		p.Name = p.GenerateName + string(rune('a'+i))
		pods[i] = p
	}
	b.Run("steady", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decide(ctx, rc, observed{pods: pods, now: time.Now()}, "none")
		}
	})
	b.Run("create", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decide(ctx, rc, observed{now: time.Now()}, "none")
		}
	})
}
