package raycluster

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A steady cluster: decide creates and removes nothing.
func TestDecideSteadyClusterIsANoOp(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	head := buildHeadPod(ctx, rc, "")
	head.Name, head.UID = "h", "uh"
	w := buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[0], "")
	w.Name, w.UID = "w", "uw"
	for _, p := range []*corev1.Pod{head, w} {
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		p.CreationTimestamp = metav1.Now()
	}
	d := decide(ctx, rc, observed{pods: []*corev1.Pod{head, w}, now: time.Now()}, "none")
	if len(d.create) != 0 || len(d.remove) != 0 {
		for _, p := range d.remove {
			t.Logf("remove %s labels %v", p.Name, p.Labels)
		}
		t.Fatalf("steady cluster: create %d remove %d", len(d.create), len(d.remove))
	}
}

func TestDecideCountsExpectedPods(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	d := decide(ctx, rc, observed{now: time.Now()}, "none")
	if len(d.create) != 2 {
		t.Fatalf("first pass creates %d", len(d.create))
	}
	for i, p := range d.create {
		p.Name = p.GenerateName + string(rune('a'+i))
	}
	rc2 := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc2.UID = "u1"
	d = decide(ctx, rc2, observed{pods: d.create, now: time.Now()}, "none")
	if len(d.create) != 0 || len(d.remove) != 0 {
		for _, p := range d.remove {
			t.Logf("remove %s hash %s labels %v", p.Name, p.Annotations[AnnotationTemplateHash], p.Labels)
		}
		for _, p := range d.create {
			t.Logf("create %s %v", p.GenerateName, p.Labels["ray.io/group"])
		}
		t.Logf("group hash %s", groupHash(rc2, &rc2.Spec.WorkerGroupSpecs[0]))
		t.Fatalf("second pass: create %d remove %d", len(d.create), len(d.remove))
	}
}
