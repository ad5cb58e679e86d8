package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
	"github.com/loom-dev/loom/internal/kueue"
)

const (
	kueuePool   = "loom.dev/e2e-kueue-pool"
	kueueNS     = "kueue-team"
	kueueLQ     = "team"
	kueueCQ     = "gpus"
	kueueFlavor = "a100-pool"
	kueueTaint  = "loom.dev/kueue-flavor"
)

// kueueObj is a Kueue object (kueue.x-k8s.io/v1beta2) from a spec.
func kueueObj(kind, ns, name string, fields map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: fields}
	u.SetAPIVersion("kueue.x-k8s.io/v1beta2")
	u.SetKind(kind)
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// queuedJob is a 1 master + 1 worker TrainingJob of 4 GPUs a pod (8 in
// all) in the LocalQueue, running until deleted.
func queuedJob(name string, labels map[string]string) *trainingv1alpha1.TrainingJob {
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"sim.loom.dev/exit-code": "0", "sim.loom.dev/run-for": "3600s"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "pytorch", Image: "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{framework.GPUResource: resource.MustParse("4")}}}}},
	}
	l := map[string]string{kueue.QueueLabel: kueueLQ}
	for k, v := range labels {
		l[k] = v
	}
	return &trainingv1alpha1.TrainingJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kueueNS, Labels: l},
		Spec: trainingv1alpha1.TrainingJobSpec{
			ReplicaSpecs: trainingv1alpha1.ReplicaSpecs{
				Master: trainingv1alpha1.ReplicaSpec{Template: tmpl},
				Worker: &trainingv1alpha1.ReplicaSpec{Replicas: ptr.To[int32](1), Template: *tmpl.DeepCopy()},
			},
			Gang: trainingv1alpha1.GangPolicy{Scheduler: trainingv1alpha1.GangNone},
		},
	}
}

func getTJ(t *testing.T, name string) *trainingv1alpha1.TrainingJob {
	t.Helper()
	j := &trainingv1alpha1.TrainingJob{}
	if err := cluster.Client.Get(context.Background(), client.ObjectKey{Namespace: kueueNS, Name: name}, j); err != nil {
		t.Fatal(err)
	}
	return j
}

// livePodsOf are a job's pods not being deleted.
func livePodsOf(t *testing.T, job *trainingv1alpha1.TrainingJob) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range podsOf(t, job) {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

func setupKueueQueues(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	objs := []*unstructured.Unstructured{
		kueueObj("ResourceFlavor", "", kueueFlavor, map[string]any{"spec": map[string]any{
			"nodeLabels":  map[string]any{kueuePool: "kueue"},
			"tolerations": []any{map[string]any{"key": kueueTaint, "operator": "Exists", "effect": "NoSchedule"}},
		}}),
		kueueObj("ClusterQueue", "", kueueCQ, map[string]any{"spec": map[string]any{
			"namespaceSelector": map[string]any{},
			// The test asserts a definite order of admission. Under the
			// default BestEffortFIFO a workload Kueue found inadmissible
			// waits to be requeued, and one created after it that fits the
			// quota just freed may go first (seen: the RayCluster took the
			// quota of a deleted job ahead of kq-c).
			"queueingStrategy": "StrictFIFO",
			"preemption":       map[string]any{"withinClusterQueue": "LowerPriority"},
			"resourceGroups": []any{map[string]any{
				"coveredResources": []any{"cpu", "memory", string(framework.GPUResource)},
				"flavors": []any{map[string]any{"name": kueueFlavor, "resources": []any{
					map[string]any{"name": "cpu", "nominalQuota": "1000"},
					map[string]any{"name": "memory", "nominalQuota": "10000Gi"},
					map[string]any{"name": string(framework.GPUResource), "nominalQuota": "16"},
				}}},
			}},
		}}),
		kueueObj("LocalQueue", kueueNS, kueueLQ, map[string]any{"spec": map[string]any{"clusterQueue": kueueCQ}}),
		kueueObj("WorkloadPriorityClass", "", "urgent", map[string]any{"value": int64(1000), "description": "preempts"}),
	}
	for _, o := range objs {
		if err := cluster.Client.Create(ctx, o); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// The real Kueue (v0.17, a local process with loopback webhooks) admits
// TrainingJobs (an external framework: Loom builds their Workloads) and
// RayClusters (Kueue's own ray.io/raycluster integration on clusters Loom
// reconciles) against one 16-GPU ClusterQueue: two 8-GPU jobs run, the third
// waits with Kueue's quota message, finishing one admits it, a RayCluster
// waits its turn, and a higher-priority job preempts a whole gang, which
// comes back afresh once the quota is free.
func TestKueueAdmitsTrainingJobsAndRayClusters(t *testing.T) {
	ctx := context.Background()
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "kq-gpu", Count: 6, GPUs: 8, Labels: map[string]string{kueuePool: "kueue"}}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kueueNS}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	startLoomManager(t)
	k, err := cluster.StartKueue(ctx, framework.KueueOptions{
		Frameworks:         []string{"ray.io/raycluster", "ray.io/rayjob"},
		ExternalFrameworks: []string{"TrainingJob.v1alpha1.training.loom.dev"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	t.Logf("Kueue %s binary ready in %s (a build, or the tool cache)", "v0.17.0", k.BuildTime.Round(time.Second))
	setupKueueQueues(t)

	jobs := []*trainingv1alpha1.TrainingJob{queuedJob("kq-a", nil), queuedJob("kq-b", nil), queuedJob("kq-c", nil)}
	// Each job is created once the one before runs (a definite queue order:
	// Kueue queues by creation time, in whole seconds), so that the
	// admission latency of the first two is theirs alone.
	for i, j := range jobs {
		time.Sleep(1100 * time.Millisecond)
		created := time.Now()
		if err := cluster.Client.Create(ctx, j); err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			break
		}
		eventually(t, 60*time.Second, func() (bool, string) { return len(podsOf(t, j)) == 2, j.Name + " pods" })
		t.Logf("admission latency of %s (create -> both pods created): %s", j.Name, time.Since(created).Round(time.Millisecond))
	}
	for _, j := range jobs[:2] {
		waitJob(t, j, trainingv1alpha1.StateRunning, 60*time.Second)
		checkPlacement(t, j)
	}
	waiting := waitJob(t, jobs[2], trainingv1alpha1.StateSuspended, 30*time.Second)
	eventually(t, 30*time.Second, func() (bool, string) {
		c := meta.FindStatusCondition(getTJ(t, "kq-c").Status.Conditions, trainingv1alpha1.ConditionScheduled)
		ok := c != nil && strings.Contains(c.Message, kueueNS+"/"+kueueLQ) && strings.Contains(c.Message, "insufficient unused quota for nvidia.com/gpu")
		return ok, fmt.Sprintf("kq-c Scheduled %+v", c)
	})
	if n := len(podsOf(t, waiting)); n != 0 {
		t.Fatalf("the waiting job has %d pods", n)
	}
	t.Logf("kq-c waits: %s", meta.FindStatusCondition(getTJ(t, "kq-c").Status.Conditions, trainingv1alpha1.ConditionScheduled).Message)

	rc := queuedRayCluster()
	if err := cluster.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	// Kueue's webhook suspends it; Loom honours spec.suspend.
	eventually(t, 20*time.Second, func() (bool, string) {
		got := &rayv1.RayCluster{}
		_ = cluster.Client.Get(ctx, client.ObjectKeyFromObject(rc), got)
		return got.Spec.Suspend != nil && *got.Spec.Suspend, "RayCluster suspended by Kueue"
	})

	// Finishing kq-a admits kq-c (queued first); the RayCluster still waits.
	if err := cluster.Client.Delete(ctx, jobs[0]); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	waitJob(t, jobs[2], trainingv1alpha1.StateRunning, 60*time.Second)
	t.Logf("kq-c admitted and running %s after kq-a was deleted", time.Since(freed).Round(time.Millisecond))
	checkPlacement(t, jobs[2])
	if all, _ := livePods(t, rc); len(all) != 0 {
		t.Fatalf("the waiting RayCluster has %d pods", len(all))
	}
	// Finishing kq-b admits the RayCluster.
	if err := cluster.Client.Delete(ctx, jobs[1]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		all, running := livePods(t, rc)
		return len(all) == 2 && running == 2, fmt.Sprintf("RayCluster pods %d, running %d", len(all), running)
	})
	all, _ := livePods(t, rc)
	for _, p := range all {
		if p.Spec.NodeSelector[kueuePool] != "kueue" {
			t.Errorf("RayCluster pod %s lacks the flavour's node selector: %v", p.Name, p.Spec.NodeSelector)
		}
	}
	if err := cluster.Client.Delete(ctx, rc); err != nil {
		t.Fatal(err)
	}
	queuedRayJob(t)
	deactivation(t, relabel(t, preemption(t, jobs[2])...))
}

// relabel: with the quota freed, a job waiting in a LocalQueue that does
// not exist is moved to the team's by changing its queue label (Kueue
// queues its Workload there and admits it), and another one stops waiting
// for Kueue when its label is removed: it runs outside the quota, and its
// Workload goes. Label edits leave the generation as it was.
func relabel(t *testing.T, running ...*trainingv1alpha1.TrainingJob) *trainingv1alpha1.TrainingJob {
	ctx := context.Background()
	for _, j := range running {
		if err := cluster.Client.Delete(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	parked := map[string]string{kueue.QueueLabel: "parked"}
	moved, unqueued := queuedJob("kq-moved", parked), queuedJob("kq-unqueued", parked)
	for _, j := range []*trainingv1alpha1.TrainingJob{moved, unqueued} {
		if err := cluster.Client.Create(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	workload := func(j *trainingv1alpha1.TrainingJob) (*unstructured.Unstructured, error) { return jobWorkload(t, j) }
	for _, j := range []*trainingv1alpha1.TrainingJob{moved, unqueued} {
		waitJob(t, j, trainingv1alpha1.StateSuspended, 30*time.Second)
		eventually(t, 30*time.Second, func() (bool, string) {
			_, err := workload(j)
			return err == nil, fmt.Sprintf("%s's Workload: %v", j.Name, err)
		})
	}
	label := func(j *trainingv1alpha1.TrainingJob, value any) {
		got := getTJ(t, j.Name)
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, kueue.QueueLabel, value)
		if err := cluster.Client.Patch(ctx, got, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
			t.Fatal(err)
		}
		if g := getTJ(t, j.Name).Generation; g != got.Generation {
			t.Fatalf("test premise: the label edit moved %s's generation %d -> %d", j.Name, got.Generation, g)
		}
	}
	label(moved, `"`+kueueLQ+`"`)
	waitJob(t, moved, trainingv1alpha1.StateRunning, 60*time.Second)
	checkPlacement(t, moved)
	if wl, err := workload(moved); err != nil {
		t.Fatal(err)
	} else if q, _, _ := unstructured.NestedString(wl.Object, "spec", "queueName"); q != kueueLQ {
		t.Errorf("kq-moved runs, its Workload in queue %q", q)
	}
	label(unqueued, "null")
	waitJob(t, unqueued, trainingv1alpha1.StateRunning, 60*time.Second)
	eventually(t, 30*time.Second, func() (bool, string) {
		_, err := workload(unqueued)
		return apierrors.IsNotFound(err), fmt.Sprintf("kq-unqueued's Workload after its label was removed: %v", err)
	})
	t.Logf("kq-moved admitted from its new LocalQueue; kq-unqueued runs outside Kueue, its Workload deleted")
	return moved
}

// jobWorkload reads the Kueue Workload Loom made for the job.
func jobWorkload(t *testing.T, j *trainingv1alpha1.TrainingJob) (*unstructured.Unstructured, error) {
	got := getTJ(t, j.Name)
	wl := &unstructured.Unstructured{}
	wl.SetGroupVersionKind(kueue.WorkloadGVK)
	key := client.ObjectKey{Namespace: kueueNS, Name: kueue.WorkloadName(got.Name, got.UID, trainingv1alpha1.GroupVersion.WithKind("TrainingJob"))}
	return wl, cluster.Client.Get(context.Background(), key, wl)
}

// queuedRayJob: Kueue's own ray.io/rayjob integration queues a RayJob (it
// is created suspended, so Loom makes no cluster), admits it into the quota
// the RayCluster freed, and Loom then creates its cluster with the
// flavour's node selector Kueue put into rayClusterSpec; Kueue does not
// queue that cluster a second time (its controller is the RayJob).
func queuedRayJob(t *testing.T) {
	ctx := context.Background()
	rc := queuedRayCluster()
	rj := &rayv1.RayJob{
		ObjectMeta: metav1.ObjectMeta{Name: "kq-rayjob", Namespace: kueueNS, Labels: map[string]string{kueue.QueueLabel: kueueLQ}},
		Spec: rayv1.RayJobSpec{Entrypoint: "python -c 'print(1)'", ShutdownAfterJobFinishes: true,
			RayClusterSpec: &rc.Spec},
	}
	if err := cluster.Client.Create(ctx, rj); err != nil {
		t.Fatal(err)
	}
	var name string
	eventually(t, 60*time.Second, func() (bool, string) {
		got := getRayJob(t, rj)
		name = got.Status.RayClusterName
		if name == "" {
			return false, fmt.Sprintf("RayJob suspend %v, status %q: no cluster yet", got.Spec.Suspend, got.Status.JobDeploymentStatus)
		}
		all, running := livePods(t, &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kueueNS}})
		return len(all) == 2 && running == 2, fmt.Sprintf("RayJob's cluster %s: pods %d, running %d", name, len(all), running)
	})
	all, _ := livePods(t, &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kueueNS}})
	for _, p := range all {
		if p.Spec.NodeSelector[kueuePool] != "kueue" {
			t.Errorf("RayJob cluster pod %s lacks the flavour's node selector: %v", p.Name, p.Spec.NodeSelector)
		}
	}
	wls := &unstructured.UnstructuredList{}
	wls.SetGroupVersionKind(kueue.WorkloadGVK.GroupVersion().WithKind("WorkloadList"))
	if err := cluster.Client.List(ctx, wls, client.InNamespace(kueueNS)); err != nil {
		t.Fatal(err)
	}
	for _, w := range wls.Items {
		if o := metav1.GetControllerOf(&w); o != nil && o.Kind == "RayCluster" && o.Name == name {
			t.Errorf("Kueue queued the RayJob's cluster %s a second time (Workload %s)", name, w.GetName())
		}
	}
	t.Logf("RayJob admitted by Kueue; its cluster %s runs on the flavour's nodes", name)
	if err := cluster.Client.Delete(ctx, rj); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		all, _ := livePods(t, &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kueueNS}})
		return len(all) == 0, fmt.Sprintf("the deleted RayJob's cluster has %d pods", len(all))
	})
}

// preemption: with kq-c and kq-d holding the 16 GPUs, an urgent job
// preempts one of them; the preempted gang loses all its pods, says so, and
// runs again as a new attempt once the urgent job is gone. It returns the
// two jobs, running.
func preemption(t *testing.T, c *trainingv1alpha1.TrainingJob) (running []*trainingv1alpha1.TrainingJob) {
	ctx := context.Background()
	d := queuedJob("kq-d", nil)
	if err := cluster.Client.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	waitJob(t, d, trainingv1alpha1.StateRunning, 60*time.Second)
	urgent := queuedJob("kq-urgent", map[string]string{kueue.PriorityClassLabel: "urgent"})
	if err := cluster.Client.Create(ctx, urgent); err != nil {
		t.Fatal(err)
	}
	var victim *trainingv1alpha1.TrainingJob
	eventually(t, 60*time.Second, func() (bool, string) {
		for _, j := range []*trainingv1alpha1.TrainingJob{c, d} {
			got := getTJ(t, j.Name)
			if s := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionSuspended); s != nil && s.Status == metav1.ConditionTrue {
				victim = got
				return true, ""
			}
		}
		return false, "no job was preempted"
	})
	before := victim.Status.Attempt
	s := meta.FindStatusCondition(victim.Status.Conditions, trainingv1alpha1.ConditionSuspended)
	if s.Reason != "EvictedByKueue" {
		t.Errorf("%s Suspended = %+v, want reason EvictedByKueue", victim.Name, s)
	}
	t.Logf("%s preempted: %s", victim.Name, s.Message)
	eventually(t, 30*time.Second, func() (bool, string) {
		n := len(livePodsOf(t, victim))
		return n == 0, fmt.Sprintf("%s still has %d pods", victim.Name, n)
	})
	waitJob(t, urgent, trainingv1alpha1.StateRunning, 60*time.Second)
	if err := cluster.Client.Delete(ctx, urgent); err != nil {
		t.Fatal(err)
	}
	got := waitJob(t, victim, trainingv1alpha1.StateRunning, 90*time.Second)
	if got.Status.Attempt != before+1 || got.Status.Restarts != 0 {
		t.Errorf("%s resumed with attempt %d (was %d), restarts %d; want a new attempt, no restart", victim.Name, got.Status.Attempt, before, got.Status.Restarts)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		pods := livePodsOf(t, victim)
		return len(pods) == 2, fmt.Sprintf("%s has %d pods", victim.Name, len(pods))
	})
	return []*trainingv1alpha1.TrainingJob{c, d}
}

// checkPlacement: the job's pods carry the admitted flavour's node selector
// and toleration, and its Scheduled condition names the ClusterQueue.
func checkPlacement(t *testing.T, j *trainingv1alpha1.TrainingJob) {
	t.Helper()
	for _, p := range livePodsOf(t, j) {
		tol := false
		for _, tl := range p.Spec.Tolerations {
			tol = tol || tl.Key == kueueTaint
		}
		if p.Spec.NodeSelector[kueuePool] != "kueue" || !tol {
			t.Errorf("pod %s: node selector %v, tolerations %v; want the flavour's", p.Name, p.Spec.NodeSelector, p.Spec.Tolerations)
		}
	}
	c := meta.FindStatusCondition(getTJ(t, j.Name).Status.Conditions, trainingv1alpha1.ConditionScheduled)
	if c == nil || !strings.Contains(c.Message, "ClusterQueue "+kueueCQ) {
		t.Errorf("%s Scheduled = %+v, want it to name ClusterQueue %s", j.Name, c, kueueCQ)
	}
}

// queuedRayCluster is a RayCluster in the LocalQueue: a head without GPUs
// and one 8-GPU worker.
func queuedRayCluster() *rayv1.RayCluster {
	pod := func(gpus string) corev1.PodTemplateSpec {
		res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		if gpus != "" {
			res[framework.GPUResource] = resource.MustParse(gpus)
		}
		return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray", Image: "rayproject/ray:2.41.0",
			Resources: corev1.ResourceRequirements{Requests: res, Limits: res}}}}}
	}
	return &rayv1.RayCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "kq-ray", Namespace: kueueNS, Labels: map[string]string{kueue.QueueLabel: kueueLQ}},
		Spec: rayv1.RayClusterSpec{
			HeadGroupSpec: rayv1.HeadGroupSpec{RayStartParams: map[string]string{}, Template: pod("")},
			WorkerGroupSpecs: []rayv1.WorkerGroupSpec{{GroupName: "gpu", RayStartParams: map[string]string{}, Replicas: ptr.To[int32](1), MinReplicas: ptr.To[int32](1), MaxReplicas: ptr.To[int32](1),
				Template: pod("8")}},
		},
	}
}
