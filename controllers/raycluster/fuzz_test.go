package raycluster

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/podset"
	"github.com/loom-dev/loom/internal/testenv"
)

// fuzzInput is one fuzzed cluster and what was observed of it.
type fuzzInput struct {
	replicas, minReplicas, maxReplicas, numOfHosts, replicas2 int32
	name, group0, group1                                      string
	suspend, autoscale, volcano                               bool
	workersToDelete                                           string
	pods                                                      []byte
	limit                                                     uint16
}

// FuzzDecide feeds decide hostile clusters (replica counts of any sign and
// size, min above max, any numOfHosts, any names, suspend, workersToDelete)
// and any set of observed pods, some of another owner. Invariants: no
// panic; no group gets more creates than it wants minus the pods it keeps;
// no pass creates more than the executor's per-pass cap; nothing is created
// for a cluster held (invalid, over the pod limit, suspended), and one
// held over the pod limit deletes only what it no longer asks for; another
// owner's pods are never deleted nor counted (the decision is the same
// without them); a removed pod is removed once; the status passes KubeRay's
// own status validation.
func FuzzDecide(f *testing.F) {
	base, err := testenv.KubeRaySample("ray-cluster.sample.yaml", "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	base.UID = "u-fuzz"
	all := []byte{0x00, 0, 0x05, 1, 0x06, 2, 0x09, 3, 0x0e, 4, 0x11, 5, 0x23, 6, 0x41, 7, 0x42, 8, 0x80 | 0x01, 9, 0x1d, 10, 0x2d, 11}
	seeds := []fuzzInput{
		{1, 0, 5, 1, 1, "raycluster-kuberay", "workergroup", "second", false, false, false, "", all, 5000},
		{100000, 0, math.MaxInt32, 1, 0, "raycluster-kuberay", "workergroup", "second", false, false, false, "", nil, 0},
		{60000, 0, math.MaxInt32, 1, 0, "raycluster-kuberay", "workergroup", "second", false, false, false, "", nil, 65535},
		{1 << 30, 0, math.MaxInt32, 4, 1 << 30, "big", "a", "b", false, false, true, "", all, 5000},
		{math.MaxInt32, math.MaxInt32, math.MaxInt32, math.MaxInt32, math.MaxInt32, "max", "a", "b", false, true, true, "", all, 65535},
		{-5, -1, -3, -2, -7, "negative", "a", "b", false, false, false, "p1,p2", all, 5000},
		{3, 5, 2, 1, 1, "minmax", "a", "b", false, false, false, "", all, 5000},
		{2, 0, 5, 1, 1, "suspended", "a", "b", true, false, false, "", all, 5000},
		{2, 0, 5, 1, 1, "Bad_Name", "Bad_Group", "headgroup", false, false, false, "", all, 5000},
		{2, 0, 5, 3, 2, strings.Repeat("n", 60), strings.Repeat("g", 70), "b", false, true, false, "p3,foreign-7", all, 5000},
		{700, 0, 1000, 1, 900, "many", "a", "b", false, false, true, "", all, 5000},
		{100000, 0, math.MaxInt32, 1, 1, "held-auto", "a", "b", false, true, false, "p1,p2,p5", all, 5000},
		{0, 0, 5, 1, 100000, "held", "a", "b", false, false, false, "p1", all, 5000},
	}
	for _, s := range seeds {
		f.Add(s.replicas, s.minReplicas, s.maxReplicas, s.numOfHosts, s.replicas2, s.name, s.group0, s.group1,
			s.suspend, s.autoscale, s.volcano, s.workersToDelete, s.pods, s.limit)
	}
	f.Fuzz(func(t *testing.T, replicas, minReplicas, maxReplicas, numOfHosts, replicas2 int32, name, group0, group1 string,
		suspend, autoscale, volcano bool, workersToDelete string, pods []byte, limit uint16) {
		in := fuzzInput{replicas, minReplicas, maxReplicas, numOfHosts, replicas2, name, group0, group1,
			suspend, autoscale, volcano, workersToDelete, pods, limit}
		checkDecide(t, fuzzCluster(base, in), in)
	})
}

// fuzzCluster is base with the fuzzed fields: two worker groups (the
// second with its own replicas), suspend, the autoscaler,
// workersToDelete.
func fuzzCluster(base *rayv1.RayCluster, in fuzzInput) *rayv1.RayCluster {
	rc := base.DeepCopy()
	rc.Name = in.name
	rc.Spec.Suspend = ptr.To(in.suspend)
	rc.Spec.EnableInTreeAutoscaling = ptr.To(in.autoscale)
	g0 := &rc.Spec.WorkerGroupSpecs[0]
	g0.GroupName = in.group0
	g0.Replicas, g0.MinReplicas, g0.MaxReplicas = ptr.To(in.replicas), ptr.To(in.minReplicas), ptr.To(in.maxReplicas)
	g0.NumOfHosts = in.numOfHosts
	g1 := g0.DeepCopy()
	g1.GroupName = in.group1
	g1.Replicas = ptr.To(in.replicas2)
	g1.NumOfHosts = 1
	if in.workersToDelete != "" {
		g0.ScaleStrategy.WorkersToDelete = strings.Split(in.workersToDelete, ",")
		g1.ScaleStrategy.WorkersToDelete = g0.ScaleStrategy.WorkersToDelete
	}
	rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, *g1)
	return rc
}

// fuzzPods are the observed pods, two bytes each (at most 256): the first
// byte's bits 0-1 the group (head, the two worker groups, a group that is
// gone), 2-3 the phase (pending, ready, running not ready, failed), 4
// terminating, 5 an outdated template, 6 another owner's, 7 named in
// workersToDelete; the second the age.
func fuzzPods(rc *rayv1.RayCluster, raw []byte, now time.Time) []*corev1.Pod {
	var out []*corev1.Pod
	ctx := context.Background()
	hashes := []string{buildHeadPod(ctx, rc, "").Annotations[AnnotationTemplateHash]}
	for i := range rc.Spec.WorkerGroupSpecs {
		hashes = append(hashes, buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[i], "").Annotations[AnnotationTemplateHash])
	}
	for i := 0; i+1 < len(raw) && len(out) < 256; i += 2 {
		b := raw[i]
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("p%d", i/2), Namespace: rc.Namespace, UID: types.UID(fmt.Sprintf("uid-%d", i/2)),
			Labels:            map[string]string{utils.RayClusterLabelKey: rc.Name, utils.RayNodeTypeLabelKey: string(rayv1.WorkerNode)},
			Annotations:       map[string]string{},
			CreationTimestamp: metav1.NewTime(now.Add(-time.Duration(raw[i+1]) * time.Second)),
			OwnerReferences:   []metav1.OwnerReference{ownerRef(rc)},
		}}
		switch b & 3 {
		case 0:
			p.Labels[utils.RayNodeTypeLabelKey] = string(rayv1.HeadNode)
			p.Labels[utils.RayNodeGroupLabelKey] = headGroup
			p.Annotations[AnnotationTemplateHash] = hashes[0]
		case 1, 2:
			g := &rc.Spec.WorkerGroupSpecs[b&3-1]
			p.Labels[utils.RayNodeGroupLabelKey] = g.GroupName
			p.Annotations[AnnotationTemplateHash] = hashes[b&3]
		default:
			p.Labels[utils.RayNodeGroupLabelKey] = "gone"
		}
		switch b >> 2 & 3 {
		case 0:
			p.Status.Phase = corev1.PodPending
		case 1:
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		case 2:
			p.Status.Phase = corev1.PodRunning
		default:
			p.Status.Phase = corev1.PodFailed
		}
		if b&0x10 != 0 {
			p.DeletionTimestamp = ptr.To(metav1.NewTime(now))
		}
		if b&0x20 != 0 {
			p.Annotations[AnnotationTemplateHash] = "outdated"
		}
		if b&0x40 != 0 {
			p.Name, p.UID = fmt.Sprintf("foreign-%d", i/2), types.UID(fmt.Sprintf("foreign-uid-%d", i/2))
			if raw[i+1]&1 == 0 {
				p.OwnerReferences[0].UID = "another-cluster"
			} else {
				p.OwnerReferences = nil
			}
		}
		if b&0x80 != 0 && b&3 != 0 && b&3 != 3 {
			g := &rc.Spec.WorkerGroupSpecs[b&3-1]
			g.ScaleStrategy.WorkersToDelete = append(g.ScaleStrategy.WorkersToDelete, p.Name)
		}
		out = append(out, p)
	}
	return out
}

// wantPods is, independently of decide's arithmetic, how many pods a
// worker group asks for (KubeRay's clamping, in 64 bits, no cap).
func wantPods(g *rayv1.WorkerGroupSpec) int64 {
	if g.Suspend != nil && *g.Suspend {
		return 0
	}
	lo, hi, n := int64(*g.MinReplicas), int64(*g.MaxReplicas), int64(*g.Replicas)
	switch {
	case lo > hi:
		n = hi
	case n < lo:
		n = lo
	case n > hi:
		n = hi
	}
	if n < 0 {
		return 0
	}
	return n * int64(max(g.NumOfHosts, 1))
}

// checkDecide decides over the fuzzed cluster and checks the invariants.
func checkDecide(t *testing.T, raw *rayv1.RayCluster, in fuzzInput) {
	t.Helper()
	ctx := ctrl.LoggerInto(context.Background(), logr.Discard())
	now := time.Unix(1700000000, 0)
	rc := normalized(raw)
	pods := fuzzPods(rc, in.pods, now)
	sched := "none"
	if in.volcano {
		sched = "volcano"
	}
	obs := observed{pods: pods, now: now, maxPods: int(in.limit), volcano: in.volcano}
	d := decide(ctx, rc, obs, sched)

	if len(d.create) > podset.PerPass {
		t.Fatalf("%d creates in one pass, more than the cap %d", len(d.create), podset.PerPass)
	}
	checkRemoves(t, rc, pods, d)
	checkCreates(t, rc, pods, d, in)
	if err := utils.ValidateRayClusterStatus(&rayv1.RayCluster{Status: d.status}); err != nil {
		t.Fatalf("status KubeRay rejects: %v", err)
	}
	st := d.status
	if st.DesiredWorkerReplicas < 0 || st.MinWorkerReplicas < 0 || st.MaxWorkerReplicas < 0 || st.ReadyWorkerReplicas < 0 || d.deferred < 0 {
		t.Fatalf("negative counts: %+v deferred %d", st, d.deferred)
	}
	// Another owner's pods change nothing: not counted, not kept, not
	// deleted.
	var own []*corev1.Pod
	for _, p := range pods {
		if !strings.HasPrefix(p.Name, "foreign-") {
			own = append(own, p)
		}
	}
	if len(own) == len(pods) {
		return
	}
	obs.pods = own
	alone := decide(ctx, rc, obs, sched)
	if len(alone.create) != len(d.create) || !reflect.DeepEqual(names(alone.remove), names(d.remove)) || !reflect.DeepEqual(alone.status, d.status) {
		t.Fatalf("another owner's pods changed the decision: creates %d vs %d, removes %v vs %v", len(d.create), len(alone.create), names(d.remove), names(alone.remove))
	}
}

func names(pods []*corev1.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// checkRemoves: every removed pod was observed, is the cluster's, and is
// removed once.
func checkRemoves(t *testing.T, rc *rayv1.RayCluster, pods []*corev1.Pod, d decision) {
	t.Helper()
	observed := map[*corev1.Pod]bool{}
	for _, p := range pods {
		observed[p] = true
	}
	seen := map[string]bool{}
	for _, p := range d.remove {
		switch {
		case !observed[p]:
			t.Fatalf("removes %s, which was not observed", p.Name)
		case !metav1.IsControlledBy(p, rc):
			t.Fatalf("removes %s, another owner's pod", p.Name)
		case seen[p.Name]:
			t.Fatalf("removes %s twice", p.Name)
		}
		seen[p.Name] = true
	}
}

// checkCreates: nothing is created for a held cluster; each group gets at
// most what it asks for less the pods it keeps; every pod created is the
// cluster's.
func checkCreates(t *testing.T, rc *rayv1.RayCluster, pods []*corev1.Pod, d decision, in fuzzInput) {
	t.Helper()
	want := map[string]int64{headGroup: 1}
	total := int64(1)
	for i := range rc.Spec.WorkerGroupSpecs {
		g := &rc.Spec.WorkerGroupSpecs[i]
		want[g.GroupName] += wantPods(g)
		total += wantPods(g)
	}
	limit := int64(in.limit)
	if limit == 0 {
		limit = manager.DefaultMaxWorkloadPods
	}
	held := in.suspend || total > limit || in.minReplicas > in.maxReplicas || in.replicas < 0 || in.minReplicas < 0 || in.maxReplicas < 0 || in.replicas2 < 0 ||
		meta.IsStatusConditionFalse(d.status.Conditions, ConditionValid)
	if held && len(d.create) > 0 {
		t.Fatalf("%d creates for a held cluster (total %d, limit %d): %+v", len(d.create), total, limit, meta.FindStatusCondition(d.status.Conditions, ConditionValid))
	}
	// A cluster held by its spec deletes nothing, unless it is suspended:
	// then every pod goes (Kueue takes the quota back). One held for
	// asking too many pods deletes only what it no longer asks for.
	valid := meta.FindStatusCondition(d.status.Conditions, ConditionValid)
	if valid != nil && valid.Status == metav1.ConditionFalse && valid.Reason != ReasonTooManyPods && !in.suspend && len(d.remove) > 0 {
		t.Fatalf("%d removes for a cluster held by its spec", len(d.remove))
	}
	removed := map[string]bool{}
	for _, p := range d.remove {
		removed[p.Name] = true
	}
	if valid != nil && valid.Reason == ReasonTooManyPods {
		checkHeldRemoves(t, rc, pods, d, want)
	}
	if in.suspend {
		// Suspended, valid or not: every live pod of the cluster goes.
		for _, p := range pods {
			if metav1.IsControlledBy(p, rc) && p.DeletionTimestamp == nil && !removed[p.Name] {
				t.Fatalf("suspended cluster keeps pod %s (valid: %+v)", p.Name, meta.FindStatusCondition(d.status.Conditions, ConditionValid))
			}
		}
	}
	kept := map[string]int64{}
	for _, p := range pods {
		if metav1.IsControlledBy(p, rc) && p.DeletionTimestamp == nil && !removed[p.Name] && p.Status.Phase != corev1.PodFailed {
			kept[groupOf(p)]++
		}
	}
	created := map[string]int64{}
	for _, p := range d.create {
		if !metav1.IsControlledBy(p, rc) {
			t.Fatalf("created pod %s is not the cluster's", p.GenerateName)
		}
		created[groupOf(p)]++
	}
	for g, n := range created {
		if n > max(want[g]-kept[g], 0) {
			t.Fatalf("group %q: %d creates, but it wants %d and keeps %d", g, n, want[g], kept[g])
		}
	}
}

// checkHeldRemoves: a cluster held for asking too many pods removes a
// live pod only when it is named in workersToDelete, its group is gone, or
// its group keeps at least the pods it asks for.
func checkHeldRemoves(t *testing.T, rc *rayv1.RayCluster, pods []*corev1.Pod, d decision, want map[string]int64) {
	t.Helper()
	drop := map[string]bool{}
	for _, g := range rc.Spec.WorkerGroupSpecs {
		for _, n := range g.ScaleStrategy.WorkersToDelete {
			drop[n] = true
		}
	}
	removed, kept := map[string]bool{}, map[string]int64{}
	for _, p := range d.remove {
		removed[p.Name] = true
	}
	for _, p := range pods {
		if metav1.IsControlledBy(p, rc) && p.DeletionTimestamp == nil && !removed[p.Name] && p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			kept[groupOf(p)]++
		}
	}
	for _, p := range d.remove {
		finished := p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
		if _, known := want[groupOf(p)]; !finished && !drop[p.Name] && known && kept[groupOf(p)] < want[groupOf(p)] {
			t.Fatalf("held cluster removes %s, leaving group %s %d of the %d pods it asks for", p.Name, groupOf(p), kept[groupOf(p)], want[groupOf(p)])
		}
	}
}
