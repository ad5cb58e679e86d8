package raycluster

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
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
		t.Logf("group hash %s", buildWorkerPod(ctx, rc2, &rc2.Spec.WorkerGroupSpecs[0], "").Annotations[AnnotationTemplateHash])
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

// The template hash is taken from the pod as KubeRay's builders make it, so
// every input they read rolls the pods it shapes, and nothing else does:
// the head's port and Service name reach the workers' ray start command,
// gcsFaultToleranceOptions and the cluster's annotations reach the head.
func TestTemplateHashCoversWhatBuildersRead(t *testing.T) {
	ctx := context.Background()
	hashes := func(rc *rayv1.RayCluster, pg string) (string, string) {
		rc = normalized(rc)
		return buildHeadPod(ctx, rc, pg).Annotations[AnnotationTemplateHash],
			buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[0], pg).Annotations[AnnotationTemplateHash]
	}
	for _, tc := range []struct {
		name         string
		edit         func(*rayv1.RayCluster)
		pg           string
		head, worker bool // whose pods roll
	}{
		{name: "head port", edit: func(rc *rayv1.RayCluster) { rc.Spec.HeadGroupSpec.RayStartParams["port"] = "6380" }, head: true, worker: true},
		{name: "head Service name", edit: func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.HeadService = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "custom-head"}}
		}, head: false, worker: true},
		{name: "GCS fault tolerance", edit: func(rc *rayv1.RayCluster) {
			rc.Spec.GcsFaultToleranceOptions = &rayv1.GcsFaultToleranceOptions{RedisAddress: "redis:6379"}
		}, head: true, worker: true},
		{name: "annotation overwrite-container-cmd", edit: func(rc *rayv1.RayCluster) {
			rc.Annotations = map[string]string{utils.RayOverwriteContainerCmdAnnotationKey: "true"}
		}, head: true, worker: true},
		{name: "worker image", edit: func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs[0].Template.Spec.Containers[0].Image = "rayproject/ray:2.99.0"
		}, head: false, worker: true},
		{name: "head image", edit: func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.Template.Spec.Containers[0].Image = "rayproject/ray:2.99.0"
		}, head: true, worker: false},
		// The autoscaler runs beside the head; KubeRay builds the workers alike.
		{name: "autoscaler", edit: func(rc *rayv1.RayCluster) { rc.Spec.EnableInTreeAutoscaling = ptr.To(true) }, head: true, worker: false},
		{name: "worker replicas", edit: func(rc *rayv1.RayCluster) { rc.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](7) }},
		{name: "PodGroup", edit: func(*rayv1.RayCluster) {}, pg: "ray-sample-pg"},
		{name: "status", edit: func(rc *rayv1.RayCluster) { rc.Status.State = rayv1.Ready }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := sample(t, "ray-cluster.sample.yaml", "unit")
			rc.UID = "u1"
			h0, w0 := hashes(rc, "")
			if h, w := hashes(rc, ""); h != h0 || w != w0 {
				t.Fatalf("building twice gave different hashes: head %s/%s, worker %s/%s", h0, h, w0, w)
			}
			tc.edit(rc)
			h1, w1 := hashes(rc, tc.pg)
			if got := !builtFrom(h0, parseStamp(h1), ""); got != tc.head {
				t.Errorf("head rolls: %v, want %v", got, tc.head)
			}
			if got := !builtFrom(w0, parseStamp(w1), ""); got != tc.worker {
				t.Errorf("workers roll: %v, want %v", got, tc.worker)
			}
		})
	}
}

// A pod built by other KubeRay builders (Loom upgraded) is rolled only
// when what it was built from changed, so that an upgrade restarts no Ray
// cluster; with the same builders, only the pod as built counts.
func TestBuiltFrom(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/ray-project/kuberay/ray-operator").Output()
	if err != nil {
		t.Fatal(err)
	}
	if v := strings.TrimSpace(string(out)); builders() != v {
		t.Errorf("builders() is %q; go.mod builds against KubeRay %s", builders(), v)
	}
	want := stamp{pod: "p2", spec: "s1", builders: "v1.6.0"}
	for _, tc := range []struct {
		have string
		want bool
	}{
		{"p2/s1/v1.6.0", true},
		{"p1/s1/v1.6.0", false},     // same builders, another pod: the spec changed in a way the spec hash does not see
		{"p2/s0/v1.6.0", true},      // same pod from another spec (a field the builders ignore)
		{"p1/s1/v1.5.0", true},      // Loom upgraded, the spec as it was
		{"p1/s0/v1.5.0", false},     // Loom upgraded and the spec changed
		{"0123456789abcdef", true},  // an earlier Loom's hash of the group's spec, the same now
		{"fedcba9876543210", false}, // an earlier Loom's, of a spec since changed
		{"", false},                 // not built by Loom
		{"p1//v1.5.0", false},       // no spec recorded
	} {
		if got := builtFrom(tc.have, want, "0123456789abcdef"); got != tc.want {
			t.Errorf("builtFrom(%q, %v) = %v, want %v", tc.have, want, got, tc.want)
		}
	}
}

// After an upgrade of Loom, pods made by other builders (a stamp of another
// KubeRay version) or by a Loom from before the stamp (a hash of the
// group's spec) are rolled only by an edit of what shapes them: not by a
// replica count, kubectl's last-applied annotation or a label.
func TestUpgradeRollsOnlyWhatChanged(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	olderBuilders := func(p *corev1.Pod) {
		st := parseStamp(p.Annotations[AnnotationTemplateHash])
		st.pod, st.builders = "0000000000000000", "v1.4.0"
		p.Annotations[AnnotationTemplateHash] = st.String()
	}
	beforeStamps := func(p *corev1.Pod) {
		if p.Labels[utils.RayNodeTypeLabelKey] == string(rayv1.HeadNode) {
			p.Annotations[AnnotationTemplateHash] = legacyHash(rc, nil)
		} else {
			p.Annotations[AnnotationTemplateHash] = legacyHash(rc, &rc.Spec.WorkerGroupSpecs[0])
		}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*rayv1.RayCluster)
		rolls bool
	}{
		{"nothing", func(*rayv1.RayCluster) {}, false},
		{"worker replicas", func(rc *rayv1.RayCluster) { rc.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](1) }, false},
		{"kubectl's last-applied annotation", func(rc *rayv1.RayCluster) {
			rc.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"spec":{}}`}
		}, false},
		{"a label", func(rc *rayv1.RayCluster) { rc.Labels = map[string]string{"volcano.sh/queue-name": "team"} }, false},
		{"the head's image", func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.Template.Spec.Containers[0].Image = "rayproject/ray:2.99.0"
		}, true},
	} {
		for _, made := range []struct {
			name  string
			stamp func(*corev1.Pod)
		}{{"other builders", olderBuilders}, {"before the stamp", beforeStamps}} {
			t.Run(made.name+", "+tc.name, func(t *testing.T) {
				head := buildHeadPod(ctx, rc, "")
				head.Name, head.UID = "h", "uh"
				w := buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[0], "")
				w.Name, w.UID = "w", "uw"
				for _, p := range []*corev1.Pod{head, w} {
					made.stamp(p)
					p.Status.Phase = corev1.PodRunning
					p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
					p.CreationTimestamp = metav1.Now()
				}
				edited := rc.DeepCopy()
				tc.edit(edited)
				d := decide(ctx, edited, observed{pods: []*corev1.Pod{head, w}, now: time.Now()}, "none")
				if rolled := slices.Contains(podNames(d.remove), "h"); rolled != tc.rolls {
					t.Fatalf("head rolled %v, want %v (removed %v)", rolled, tc.rolls, podNames(d.remove))
				}
			})
		}
	}
}

// A new head port: the head rolls first; once the new head is ready, the
// workers built to dial the old port roll too.
func TestHeadPortRollsWorkersAfterHead(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	running := func(p *corev1.Pod, name string) *corev1.Pod {
		p.Name, p.UID = name, types.UID("uid-"+name)
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		p.CreationTimestamp = metav1.Now()
		return p
	}
	oldHead := running(buildHeadPod(ctx, rc, ""), "h-old")
	oldWorker := running(buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[0], ""), "w-old")
	rc.Spec.HeadGroupSpec.RayStartParams["port"] = "6380"

	d := decide(ctx, rc, observed{pods: []*corev1.Pod{oldHead, oldWorker}, now: time.Now()}, "none")
	if names := podNames(d.remove); !slices.Equal(names, []string{"h-old"}) {
		t.Fatalf("first the head alone rolls; removed %v", names)
	}
	newHead := running(buildHeadPod(ctx, rc, ""), "h-new")
	d = decide(ctx, rc, observed{pods: []*corev1.Pod{newHead, oldWorker}, now: time.Now()}, "none")
	if names := podNames(d.remove); !slices.Equal(names, []string{"w-old"}) {
		t.Fatalf("with the new head ready, the worker dialing port 6379 rolls; removed %v", names)
	}
}

func podNames(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// Ready is counted group by group: with the autoscaler a group keeps its
// surplus pods, which must not stand in for another group's missing ones;
// pods named in workersToDelete are about to go and do not count.
func TestReadyIsCountedPerGroup(t *testing.T) {
	ctx := context.Background()
	pod := func(rc *rayv1.RayCluster, group int, name string, ready bool) *corev1.Pod {
		var p *corev1.Pod
		if group < 0 {
			p = buildHeadPod(ctx, rc, "")
		} else {
			p = buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[group], "")
		}
		p.Name, p.UID, p.CreationTimestamp = name, types.UID("uid-"+name), metav1.Now()
		p.Status.Phase = corev1.PodPending
		if ready {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		return p
	}
	for _, tc := range []struct {
		name     string
		pods     func(rc *rayv1.RayCluster) []*corev1.Pod
		toDelete []string // group a's workersToDelete
		want     bool
	}{
		{"every group has its pod", func(rc *rayv1.RayCluster) []*corev1.Pod {
			return []*corev1.Pod{pod(rc, 0, "a1", true), pod(rc, 1, "b1", true)}
		}, nil, true},
		{"a's surplus beside b's pending pod", func(rc *rayv1.RayCluster) []*corev1.Pod {
			return []*corev1.Pod{pod(rc, 0, "a1", true), pod(rc, 0, "a2", true), pod(rc, 1, "b1", false)}
		}, nil, false},
		{"a's surplus with b's pod ready", func(rc *rayv1.RayCluster) []*corev1.Pod {
			return []*corev1.Pod{pod(rc, 0, "a1", true), pod(rc, 0, "a2", true), pod(rc, 1, "b1", true)}
		}, nil, true},
		{"a's only ready pod about to be deleted", func(rc *rayv1.RayCluster) []*corev1.Pod {
			return []*corev1.Pod{pod(rc, 0, "a1", true), pod(rc, 0, "a2", false), pod(rc, 1, "b1", true)}
		}, []string{"a1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
			rc.UID = "u1"
			rc.Spec.EnableInTreeAutoscaling = ptr.To(true)
			b := *rc.Spec.WorkerGroupSpecs[0].DeepCopy()
			b.GroupName = "b"
			rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, b)
			rc.Spec.WorkerGroupSpecs[0].GroupName = "a"
			for i := range rc.Spec.WorkerGroupSpecs {
				rc.Spec.WorkerGroupSpecs[i].Replicas = ptr.To[int32](1)
			}
			rc.Spec.WorkerGroupSpecs[0].ScaleStrategy.WorkersToDelete = tc.toDelete
			pods := append(tc.pods(rc), pod(rc, -1, "h", true))
			d := decide(ctx, rc, observed{pods: pods, now: time.Now()}, "none")
			if got := d.status.State == rayv1.Ready; got != tc.want {
				t.Fatalf("ready %v, want %v (readyWorkerReplicas %d of %d desired)", got, tc.want, d.status.ReadyWorkerReplicas, d.status.DesiredWorkerReplicas)
			}
		})
	}
}
