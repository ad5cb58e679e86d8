package raycluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/testenv"
)

// waitCondition waits for the cluster's condition of type t to have reason
// and a message containing each of want.
func waitCondition(t *testing.T, rc *rayv1.RayCluster, typ, reason string, want ...string) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	testenv.Eventually(t, 30*time.Second, func() error {
		c = meta.FindStatusCondition(get(t, rc).Status.Conditions, typ)
		if c == nil || c.Reason != reason {
			return fmt.Errorf("%s %+v, want reason %s", typ, c, reason)
		}
		for _, w := range want {
			if !strings.Contains(c.Message, w) {
				return fmt.Errorf("%s message %q lacks %q", typ, c.Message, w)
			}
		}
		return nil
	})
	return c
}

// Names the cluster wants that strangers hold: the head pod's (KubeRay's
// deterministic head pod name) and the head Service's. Each is a
// NameConflict naming the object, which is left exactly as it was.
func TestNameConflicts(t *testing.T) {
	t.Setenv("ENABLE_DETERMINISTIC_HEAD_POD_NAME", "true")
	startManager(t, "none")
	ctx := context.Background()

	rc := sample(t, "ray-cluster.sample.yaml", "ray-conflict")
	rc.Name = "pod-taken"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-taken-head", Namespace: rc.Namespace},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc-taken-head-svc", Namespace: rc.Namespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	for _, o := range []client.Object{pod, svc, rc} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	waitCondition(t, rc, string(rayv1.RayClusterReplicaFailure), ReasonNameConflict, "pod pod-taken-head exists and is not controlled by pod-taken")

	rc2 := sample(t, "ray-cluster.sample.yaml", "ray-conflict")
	rc2.Name = "svc-taken"
	if err := env.Client.Create(ctx, rc2); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, rc2, string(rayv1.RayClusterReplicaFailure), ReasonNameConflict, "Service ray-conflict/svc-taken-head-svc exists")

	time.Sleep(time.Second)
	for _, o := range []client.Object{pod, svc} {
		got := o.DeepCopyObject().(client.Object)
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			t.Fatal(err)
		}
		if got.GetResourceVersion() != o.GetResourceVersion() || got.GetDeletionTimestamp() != nil || len(got.GetOwnerReferences()) != 0 {
			t.Fatalf("the stranger's %s was touched: rv %s → %s, owners %v", o.GetName(), o.GetResourceVersion(), got.GetResourceVersion(), got.GetOwnerReferences())
		}
	}
	if n := len(rayPods(t, rc2)); n != 0 {
		t.Fatalf("svc-taken has %d groups of pods without its head Service", n)
	}

	// The stranger's pod goes: the cluster gets its head, and the
	// condition clears.
	if err := env.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	update(t, rc, func(c *rayv1.RayCluster) { c.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](2) }) // a change wakes it
	waitPods(t, rc, map[string]int{"headgroup": 1, "workergroup": 2})
	waitCondition(t, rc, string(rayv1.RayClusterReplicaFailure), "Applied")
}

// A cluster asking for more pods than --max-workload-pods is held: no pod
// is created, the spec-validity condition says why; asking for fewer
// releases it. Held, it still deletes the pods workersToDelete names.
func TestTooManyPodsIsHeld(t *testing.T) {
	startManager(t, "none")
	ctx := context.Background()
	rc := sample(t, "ray-cluster.sample.yaml", "ray-huge")
	rc.Name = "huge"
	g := &rc.Spec.WorkerGroupSpecs[0]
	g.Replicas, g.MaxReplicas = ptr.To[int32](100000), ptr.To[int32](100000)
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, rc, ConditionValid, ReasonTooManyPods, "asks for 100001 pods", "more than the 5000 pods")
	time.Sleep(time.Second)
	if pods := rayPods(t, rc); len(pods) != 0 {
		t.Fatalf("a held cluster has pods: %v", pods)
	}
	update(t, rc, func(c *rayv1.RayCluster) { c.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](2) })
	workers := waitPods(t, rc, map[string]int{"headgroup": 1, "workergroup": 2})["workergroup"]
	testenv.Eventually(t, 10*time.Second, func() error {
		if c := meta.FindStatusCondition(get(t, rc).Status.Conditions, ConditionValid); c != nil {
			return fmt.Errorf("still %+v", c)
		}
		return nil
	})

	// Held again (replicas raised past the limit, as an autoscaler may),
	// the pod workersToDelete names still goes; none is created.
	update(t, rc, func(c *rayv1.RayCluster) {
		g := &c.Spec.WorkerGroupSpecs[0]
		g.Replicas = ptr.To[int32](100000)
		g.ScaleStrategy.WorkersToDelete = []string{workers[0].Name}
	})
	waitCondition(t, rc, ConditionValid, ReasonTooManyPods, "asks for 100001 pods")
	left := waitPods(t, rc, map[string]int{"headgroup": 1, "workergroup": 1})
	if left["workergroup"][0].Name != workers[1].Name {
		t.Fatalf("kept %s, want %s", left["workergroup"][0].Name, workers[1].Name)
	}
}
