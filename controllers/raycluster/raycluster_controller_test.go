package raycluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

// testenv starts no API server for go test -fuzz's workers.
func TestMain(m *testing.M) { testenv.MainWithout(m, &env, "scheduling.volcano.sh") }

func startManager(t *testing.T, scheduler string) {
	t.Helper()
	reg := &manager.Registry{}
	reg.Add("raycluster", Setup)
	opts := testenv.ManagerOptions(t)
	opts.LeaderElect = false
	opts.GangScheduler = scheduler
	env.StartManager(t, opts, reg)
}

// sample is one of KubeRay's own sample RayClusters, in namespace ns.
func sample(t *testing.T, file, ns string) *rayv1.RayCluster {
	t.Helper()
	rc, err := testenv.KubeRaySample(file, ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.CreateNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return rc
}

func get(t *testing.T, rc *rayv1.RayCluster) *rayv1.RayCluster {
	t.Helper()
	got := &rayv1.RayCluster{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), got); err != nil {
		t.Fatal(err)
	}
	return got
}

func update(t *testing.T, rc *rayv1.RayCluster, f func(*rayv1.RayCluster)) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		got := get(t, rc)
		f(got)
		return env.Client.Update(context.Background(), got)
	})
}

// rayPods lists the cluster's live pods by group, sorted by name.
func rayPods(t *testing.T, rc *rayv1.RayCluster) map[string][]corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(rc.Namespace), client.MatchingLabels{"ray.io/cluster": rc.Name}); err != nil {
		t.Fatal(err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	out := map[string][]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Labels["ray.io/group"]] = append(out[p.Labels["ray.io/group"]], p)
		}
	}
	return out
}

func waitPods(t *testing.T, rc *rayv1.RayCluster, want map[string]int) map[string][]corev1.Pod {
	t.Helper()
	var pods map[string][]corev1.Pod
	testenv.Eventually(t, 30*time.Second, func() error {
		pods = rayPods(t, rc)
		for g, n := range want {
			if len(pods[g]) != n {
				return fmt.Errorf("group %s has %d pods, want %d", g, len(pods[g]), n)
			}
		}
		return nil
	})
	return pods
}

// ready marks pods running and ready, as a kubelet would.
func ready(t *testing.T, pods ...corev1.Pod) {
	t.Helper()
	for i := range pods {
		p := &pods[i]
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = fmt.Sprintf("10.1.0.%d", i+2)
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if err := env.Client.Status().Update(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
}

func waitState(t *testing.T, rc *rayv1.RayCluster, state rayv1.ClusterState) *rayv1.RayCluster {
	t.Helper()
	var got *rayv1.RayCluster
	testenv.Eventually(t, 30*time.Second, func() error {
		got = get(t, rc)
		if got.Status.State != state {
			return fmt.Errorf("state %q, want %q; conditions %+v", got.Status.State, state, got.Status.Conditions)
		}
		return nil
	})
	return got
}

// KubeRay's own sample: head and worker pods and the head Service as
// KubeRay makes them; status that follows reality; scale up and down,
// workersToDelete, a template change rolling, suspend and resume.
func TestKubeRaySampleLifecycle(t *testing.T) {
	ctx := context.Background()
	rc, head, worker := rayStarted(ctx, t)
	rayWorkerDeleted(ctx, t, rc, worker)
	workers := rayScaled(t, rc)
	rayRolled(t, rc, head, workers)
	raySuspended(t, rc)
}

// rayStarted creates KubeRay's sample and checks its pods, head Service and
// status as it becomes ready.
func rayStarted(ctx context.Context, t *testing.T) (*rayv1.RayCluster, corev1.Pod, corev1.Pod) {
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "ray-sample")
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	pods := waitPods(t, rc, map[string]int{"headgroup": 1, "workergroup": 1})
	head, worker := pods["headgroup"][0], pods["workergroup"][0]
	if !strings.HasPrefix(head.Name, "raycluster-kuberay-head-") || !strings.HasPrefix(worker.Name, "raycluster-kuberay-workergroup-worker-") {
		t.Fatalf("pod names %s, %s", head.Name, worker.Name)
	}
	for k, v := range map[string]string{"ray.io/cluster": "raycluster-kuberay", "ray.io/node-type": "head", "ray.io/is-ray-node": "yes"} {
		if head.Labels[k] != v {
			t.Fatalf("head label %s=%q, want %q", k, head.Labels[k], v)
		}
	}
	if cmd := strings.Join(append(head.Spec.Containers[0].Command, head.Spec.Containers[0].Args...), " "); !strings.Contains(cmd, "ray start --head") {
		t.Fatalf("head command %q", cmd)
	}
	if args := strings.Join(worker.Spec.Containers[0].Args, " "); !strings.Contains(args, "--address=raycluster-kuberay-head-svc.ray-sample.svc.cluster.local:6379") {
		t.Fatalf("worker args %q", args)
	}
	svc := &corev1.Service{}
	testenv.Eventually(t, 10*time.Second, func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: "raycluster-kuberay-head-svc"}, svc)
	})
	ports := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		ports[p.Name] = p.Port
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || ports["gcs-server"] != 6379 || ports["dashboard"] != 8265 || ports["client"] != 10001 {
		t.Fatalf("head Service clusterIP %q ports %v", svc.Spec.ClusterIP, ports)
	}

	got := get(t, rc)
	if got.Status.State == rayv1.Ready {
		t.Fatal("ready while its pods are pending")
	}
	ready(t, head, worker)
	got = waitState(t, rc, rayv1.Ready)
	if got.Status.ReadyWorkerReplicas != 1 || got.Status.DesiredWorkerReplicas != 1 || got.Status.Head.PodName != head.Name ||
		got.Status.Head.ServiceName != "raycluster-kuberay-head-svc" || got.Status.Endpoints["dashboard"] != "8265" {
		t.Fatalf("status %+v", got.Status)
	}
	if got.Status.DesiredCPU.Cmp(resource.MustParse("2")) != 0 || got.Status.DesiredMemory.Cmp(resource.MustParse("3G")) != 0 {
		t.Fatalf("desired CPU %s memory %s", got.Status.DesiredCPU.String(), got.Status.DesiredMemory.String())
	}
	return rc, head, worker
}

// rayWorkerDeleted: a worker deleted by hand; not ready until its
// replacement is.
func rayWorkerDeleted(ctx context.Context, t *testing.T, rc *rayv1.RayCluster, worker corev1.Pod) {
	if err := env.Client.Delete(ctx, &worker); err != nil {
		t.Fatal(err)
	}
	waitState(t, rc, "")
	pods := waitPods(t, rc, map[string]int{"workergroup": 1})
	ready(t, pods["workergroup"]...)
	waitState(t, rc, rayv1.Ready)
}

// rayScaled scales the workers up to 3, then down to 2 naming the pod to
// go; it returns the two left.
func rayScaled(t *testing.T, rc *rayv1.RayCluster) []corev1.Pod {
	update(t, rc, func(c *rayv1.RayCluster) { c.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](3) })
	pods := waitPods(t, rc, map[string]int{"workergroup": 3})
	ready(t, pods["workergroup"]...)
	victim := pods["workergroup"][1].Name
	update(t, rc, func(c *rayv1.RayCluster) {
		c.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](2)
		c.Spec.WorkerGroupSpecs[0].ScaleStrategy.WorkersToDelete = []string{victim}
	})
	pods = waitPods(t, rc, map[string]int{"workergroup": 2})
	for _, p := range pods["workergroup"] {
		if p.Name == victim {
			t.Fatalf("workersToDelete named %s but another pod went", victim)
		}
	}
	time.Sleep(time.Second)
	if n := len(rayPods(t, rc)["workergroup"]); n != 2 {
		t.Fatalf("%d workers after scaling to 2", n)
	}
	return pods["workergroup"]
}

// rayRolled: a template change recreates the group's pods; the head stays.
func rayRolled(t *testing.T, rc *rayv1.RayCluster, head corev1.Pod, workers []corev1.Pod) {
	update(t, rc, func(c *rayv1.RayCluster) {
		c.Spec.WorkerGroupSpecs[0].ScaleStrategy.WorkersToDelete = nil
		c.Spec.WorkerGroupSpecs[0].Template.Spec.Containers[0].Env = append(c.Spec.WorkerGroupSpecs[0].Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "NEW", Value: "1"})
	})
	old := map[string]bool{}
	for _, p := range workers {
		old[p.Name] = true
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		ws := rayPods(t, rc)["workergroup"]
		if len(ws) != 2 {
			return fmt.Errorf("%d workers", len(ws))
		}
		for _, p := range ws {
			if old[p.Name] {
				return fmt.Errorf("old pod %s still there", p.Name)
			}
		}
		return nil
	})
	if h := rayPods(t, rc)["headgroup"]; len(h) != 1 || h[0].Name != head.Name {
		t.Fatalf("the head was recreated for a worker template change: %v", h)
	}
}

// raySuspended: suspend deletes everything; resume brings the pods back.
func raySuspended(t *testing.T, rc *rayv1.RayCluster) {
	update(t, rc, func(c *rayv1.RayCluster) { c.Spec.Suspend = ptr.To(true) })
	waitState(t, rc, rayv1.Suspended)
	if n := len(rayPods(t, rc)); n != 0 {
		t.Fatalf("suspended cluster keeps %d groups of pods", n)
	}
	update(t, rc, func(c *rayv1.RayCluster) { c.Spec.Suspend = ptr.To(false) })
	waitPods(t, rc, map[string]int{"headgroup": 1, "workergroup": 2})
	// The pass writes its status after its pods: the pods can be seen first.
	testenv.Eventually(t, 10*time.Second, func() error {
		got := get(t, rc)
		if c := meta.FindStatusCondition(got.Status.Conditions, string(rayv1.RayClusterSuspended)); c == nil || c.Status != metav1.ConditionFalse {
			return fmt.Errorf("RayClusterSuspended after resume = %+v", c)
		}
		return nil
	})
}

// The autoscaler sample asking for Volcano: held with a condition until the
// CRDs exist; then a PodGroup whose minMember and minResources count the head
// with its autoscaler sidecar and the minimum workers; the autoscaler's RBAC.
func TestAutoscalerClusterOnVolcano(t *testing.T) {
	startManager(t, "none")
	ctx := context.Background()
	rc := sample(t, "ray-cluster.autoscaler.yaml", "ray-auto")
	if rc.Labels == nil {
		rc.Labels = map[string]string{}
	}
	rc.Labels[LabelScheduler] = "volcano"
	rc.Labels[LabelQueue] = "ray-queue"
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionGang)
		if c == nil || c.Reason != "VolcanoNotInstalled" {
			return fmt.Errorf("gang condition %+v", c)
		}
		return nil
	})
	if pods := rayPods(t, rc); len(pods) != 0 {
		t.Fatalf("pods created without the PodGroup CRD: %v", pods)
	}
	if err := env.InstallCRDs(ctx, "scheduling.volcano.sh"); err != nil {
		t.Fatal(err)
	}
	pods := waitPods(t, rc, map[string]int{"headgroup": 1})
	head := pods["headgroup"][0]
	if head.Spec.SchedulerName != "volcano" || head.Annotations["scheduling.k8s.io/group-name"] != "ray-"+rc.Name+"-pg" {
		t.Fatalf("head not in the gang: scheduler %q annotations %v", head.Spec.SchedulerName, head.Annotations)
	}
	names := []string{}
	for _, c := range head.Spec.Containers {
		names = append(names, c.Name)
	}
	if len(head.Spec.Containers) != 2 {
		t.Fatalf("head containers %v: want the autoscaler sidecar", names)
	}
	pg := &schedulingv1beta1.PodGroup{}
	testenv.Eventually(t, 10*time.Second, func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: "ray-" + rc.Name + "-pg"}, pg)
	})
	g := rc.Spec.WorkerGroupSpecs[0]
	wantMin := 1 + *g.MinReplicas
	if pg.Spec.MinMember != wantMin || pg.Spec.Queue != "ray-queue" {
		t.Fatalf("PodGroup minMember %d queue %q, want %d ray-queue", pg.Spec.MinMember, pg.Spec.Queue, wantMin)
	}
	// minResources = head (ray container + autoscaler sidecar) + minReplicas workers.
	var wantCPU resource.Quantity
	for _, c := range head.Spec.Containers {
		wantCPU.Add(*c.Resources.Requests.Cpu())
	}
	for range *g.MinReplicas {
		wantCPU.Add(*g.Template.Spec.Containers[0].Resources.Requests.Cpu())
	}
	if got := (*pg.Spec.MinResources)[corev1.ResourceCPU]; got.Cmp(wantCPU) != 0 {
		t.Fatalf("minResources cpu %s, want %s (head with sidecar + %d workers)", got.String(), wantCPU.String(), *g.MinReplicas)
	}
	for _, o := range []client.Object{&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}} {
		testenv.Eventually(t, 10*time.Second, func() error {
			return env.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: rc.Name}, o)
		})
	}
	rayQueue(t, rc)
}

// rayQueue: the cluster's queue is missing, so GangScheduling says so;
// created, the condition follows the Queue without a change to the cluster.
func rayQueue(t *testing.T, rc *rayv1.RayCluster) {
	gangCond := func(s metav1.ConditionStatus, reason, msg string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func() error {
			c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionGang)
			if c == nil || c.Status != s || c.Reason != reason || !strings.Contains(c.Message, msg) {
				return fmt.Errorf("gang condition %+v, want %s %s containing %q", c, s, reason, msg)
			}
			return nil
		})
	}
	gangCond(metav1.ConditionFalse, gang.ReasonQueueNotFound, `Volcano queue "ray-queue" does not exist`)
	if err := env.Client.Create(context.Background(), &schedulingv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "ray-queue"},
		Spec: schedulingv1beta1.QueueSpec{Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	gangCond(metav1.ConditionTrue, "PodGroupCreated", "through PodGroup ray-"+rc.Name+"-pg")
}

// A worker group asking for more GPUs per pod than any node has gets a
// condition naming the gap.
func TestGPUInventoryGap(t *testing.T) {
	startManager(t, "none")
	ctx := context.Background()
	rc := sample(t, "ray-cluster.sample.yaml", "ray-gpu")
	rc.Name = "too-big"
	rc.Spec.WorkerGroupSpecs[0].Template.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = resource.MustParse("16")
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionGPUs)
		if c == nil || c.Reason != "NeverFits" || !strings.Contains(c.Message, "group workergroup: needs 1 pod × 16 nvidia.com/gpu") {
			return fmt.Errorf("GPU condition %+v", c)
		}
		return nil
	})
}

// A cluster held because of an annotation (KubeRay's validator refuses
// ray.io/ft-enabled beside gcsFaultToleranceOptions) is fixed by removing
// the annotation: an edit that leaves the generation as it was, and that
// the controller must still see.
func TestAnnotationFixIsSeen(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "annotation-fix")
	rc.Annotations = map[string]string{utils.RayFTEnabledAnnotationKey: "true"}
	rc.Spec.GcsFaultToleranceOptions = &rayv1.GcsFaultToleranceOptions{RedisAddress: "redis:6379"}
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionValid); c == nil || c.Status != metav1.ConditionFalse {
			return fmt.Errorf("SpecValid %+v, want False", c)
		}
		return nil
	})
	gen := get(t, rc).Generation
	update(t, rc, func(r *rayv1.RayCluster) { delete(r.Annotations, utils.RayFTEnabledAnnotationKey) })
	if g := get(t, rc).Generation; g != gen {
		t.Fatalf("test premise: removing the annotation moved the generation %d -> %d", gen, g)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionValid); c != nil && c.Status == metav1.ConditionFalse {
			return fmt.Errorf("annotation removed, still held: %s", c.Message)
		}
		if n := len(rayPods(t, rc)[headGroup]); n != 1 {
			return fmt.Errorf("%d head pods", n)
		}
		return nil
	})
}
