package raycluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
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
	// A multi-host group's hosts find each other through the headless
	// worker Service: a stranger's of its name holds the cluster too.
	rc3 := sample(t, "ray-cluster.sample.yaml", "ray-conflict")
	rc3.Name = "headless-taken"
	rc3.Spec.WorkerGroupSpecs[0].NumOfHosts = 2
	headless := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "headless-taken-headless", Namespace: rc3.Namespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	for _, o := range []client.Object{headless, rc3} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	waitCondition(t, rc3, string(rayv1.RayClusterReplicaFailure), ReasonNameConflict, "Service ray-conflict/headless-taken-headless exists")
	time.Sleep(time.Second)
	if n := len(rayPods(t, rc3)); n != 0 {
		t.Fatalf("headless-taken has %d groups of pods without its headless worker Service", n)
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

// A person's objects holding the names of the cluster's optional children
// (the serve Service, the dashboard Ingress) do not stop the cluster: its
// pods are made, the objects are left exactly as they were, and
// ReplicaFailure says NameConflict naming each and what to rename. Once
// they are gone, the cluster makes its own and the condition clears.
func TestOptionalChildNameConflict(t *testing.T) {
	startManager(t, "none")
	ctx := context.Background()
	rc := sample(t, "ray-cluster.sample.yaml", "ray-conflict-opt")
	rc.Name = "opt-taken"
	rc.Annotations = map[string]string{"ray.io/enable-serve-service": "true"}
	rc.Spec.HeadGroupSpec.EnableIngress = ptr.To(true)
	head := &rc.Spec.HeadGroupSpec.Template.Spec.Containers[0]
	head.Ports = append(head.Ports, corev1.ContainerPort{Name: "serve", ContainerPort: 8000})
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "opt-taken-serve-svc", Namespace: rc.Namespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "opt-taken-head-ingress", Namespace: rc.Namespace},
		Spec: networkingv1.IngressSpec{DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
			Name: "mine", Port: networkingv1.ServiceBackendPort{Number: 80}}}}}
	for _, o := range []client.Object{svc, ing, rc} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	waitPods(t, rc, map[string]int{"headgroup": 1, "workergroup": 1})
	waitCondition(t, rc, string(rayv1.RayClusterReplicaFailure), ReasonNameConflict,
		"Service ray-conflict-opt/opt-taken-serve-svc exists", "Ingress ray-conflict-opt/opt-taken-head-ingress exists", "rename the RayCluster")
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: "opt-taken-head-svc"}, &corev1.Service{}); err != nil {
		t.Fatalf("the head Service: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		list := &eventsv1.EventList{}
		if err := env.Client.List(ctx, list, client.InNamespace(rc.Namespace)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Regarding.Name == rc.Name && e.Type == corev1.EventTypeWarning && e.Reason == ReasonNameConflict && strings.Contains(e.Note, "opt-taken-serve-svc") {
				return nil
			}
		}
		return fmt.Errorf("no NameConflict Warning among %d events", len(list.Items))
	})
	time.Sleep(time.Second)
	for _, o := range []client.Object{svc, ing} {
		got := o.DeepCopyObject().(client.Object)
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			t.Fatal(err)
		}
		if got.GetResourceVersion() != o.GetResourceVersion() || len(got.GetOwnerReferences()) != 0 {
			t.Fatalf("the person's %s was touched: rv %s → %s, owners %v", o.GetName(), o.GetResourceVersion(), got.GetResourceVersion(), got.GetOwnerReferences())
		}
	}

	// The person's objects go: the cluster makes its own, and the
	// condition clears.
	for _, o := range []client.Object{svc, ing} {
		if err := env.Client.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	update(t, rc, func(c *rayv1.RayCluster) { c.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](2) }) // a change wakes it
	waitCondition(t, rc, string(rayv1.RayClusterReplicaFailure), "Applied")
	own := &corev1.Service{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(svc), own); err != nil || !metav1.IsControlledBy(own, get(t, rc)) {
		t.Fatalf("the cluster's serve Service: %v, owners %v", err, own.OwnerReferences)
	}
}
