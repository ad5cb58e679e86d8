package raycluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/log"
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

// Two worker groups and the head all outdated: the head rolls first (the
// workers need its GCS); the worker groups wait for it, one after another.
func TestRolloutIsGroupByGroup(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	second := *rc.Spec.WorkerGroupSpecs[0].DeepCopy()
	second.GroupName = "second"
	rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, second)
	var pods []*corev1.Pod
	mk := func(p *corev1.Pod, name string) {
		p.Name, p.UID = name, types.UID("uid-"+name)
		p.Annotations[AnnotationTemplateHash] = "old"
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		pods = append(pods, p)
	}
	mk(buildHeadPod(ctx, rc, ""), "head")
	mk(buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[0], ""), "w1")
	mk(buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[1], ""), "w2")
	d := decide(ctx, rc, observed{pods: pods, now: time.Now()}, "none")
	if len(d.remove) != 1 || d.remove[0].Name != "head" {
		var names []string
		for _, p := range d.remove {
			names = append(names, p.Name)
		}
		t.Fatalf("removes %v, want only the head", names)
	}
	if len(d.create) != 1 || d.create[0].Labels["ray.io/node-type"] != "head" {
		t.Fatalf("creates %d pods", len(d.create))
	}
	// The new head runs and is ready: the first worker group goes next.
	newHead := buildHeadPod(ctx, rc, "")
	newHead.Name, newHead.UID = "head2", "uid-head2"
	newHead.Status.Phase = corev1.PodRunning
	newHead.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	d = decide(ctx, rc, observed{pods: []*corev1.Pod{newHead, pods[1], pods[2]}, now: time.Now()}, "none")
	if len(d.remove) != 1 || d.remove[0].Name != "w1" {
		t.Fatalf("after the head: removes %d pods, want only w1", len(d.remove))
	}
}

// Scale-down without the autoscaler removes a not-ready pod before ready
// ones; with it, only workersToDelete removes pods.
func TestScaleDownChoosesTheLeastUseful(t *testing.T) {
	ctx := context.Background()
	for _, auto := range []bool{false, true} {
		rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
		rc.UID = "u1"
		rc.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](1)
		rc.Spec.EnableInTreeAutoscaling = ptr.To(auto)
		var pods []*corev1.Pod
		for i, readyPod := range []bool{true, false} {
			p := buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[0], "")
			p.Name, p.UID = fmt.Sprintf("w%d", i), types.UID(fmt.Sprintf("u%d", i))
			p.Status.Phase = corev1.PodRunning
			if readyPod {
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			}
			pods = append(pods, p)
		}
		head := buildHeadPod(ctx, rc, "")
		head.Name = "h"
		pods = append(pods, head)
		d := decide(ctx, rc, observed{pods: pods, now: time.Now()}, "none")
		switch {
		case !auto && (len(d.remove) != 1 || d.remove[0].Name != "w1"):
			t.Fatalf("scale-down removed %d pods, want only the not-ready w1", len(d.remove))
		case auto && len(d.remove) != 0:
			t.Fatalf("with the autoscaler, %s went though workersToDelete names nothing", d.remove[0].Name)
		}
	}
}

func TestDecideRejectsDuplicateGroupNames(t *testing.T) {
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, *rc.Spec.WorkerGroupSpecs[0].DeepCopy())
	if err := validateGroupNames(rc); err == nil {
		t.Fatal("duplicate group names accepted")
	}
	rc.Spec.WorkerGroupSpecs[1].GroupName = "headgroup"
	if err := validateGroupNames(rc); err == nil {
		t.Fatal("a worker group named headgroup accepted")
	}
	rc.Spec.WorkerGroupSpecs[1].GroupName = "second"
	if err := validateGroupNames(rc); err != nil {
		t.Fatal(err)
	}
}

// A RayCluster without rayStartParams (optional in ray.io/v1) builds.
func TestNoRayStartParams(t *testing.T) {
	ctx := context.Background()
	rc := sample(t, "ray-cluster.sample.yaml", "unit")
	rc.Spec.HeadGroupSpec.RayStartParams = nil
	rc.Spec.WorkerGroupSpecs[0].RayStartParams = nil
	n := normalized(rc)
	_ = buildHeadPod(ctx, n, "")
	_ = buildWorkerPod(ctx, n, &n.Spec.WorkerGroupSpecs[0], "")
}

// KubeRay's builders log every pod they build at info; a pass that builds
// pods logs them one verbosity down, so the manager's info log stays a
// log of what happened, not of every ray start command.
func TestDecideBuildersLogAtDebug(t *testing.T) {
	var lines []string
	sink := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: 0})
	ctx := log.IntoContext(context.Background(), sink)
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	if d := decide(ctx, rc, observed{now: time.Now()}, "none"); len(d.create) != 2 {
		t.Fatalf("first pass creates %d", len(d.create))
	}
	if len(lines) != 0 {
		t.Fatalf("building 2 pods logged %d lines at info, first %s", len(lines), lines[0])
	}
	sink = funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: 1})
	decide(log.IntoContext(context.Background(), sink), rc, observed{now: time.Now()}, "none")
	if len(lines) == 0 {
		t.Fatal("at debug verbosity the builders' lines are gone too")
	}
}
