package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/e2e/framework"
	"github.com/loom-dev/loom/internal/testenv"
)

func kuberaySample(t *testing.T, file, ns string) *rayv1.RayCluster {
	t.Helper()
	rc, err := testenv.KubeRaySample(file, ns)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

func livePods(t *testing.T, rc *rayv1.RayCluster) (all []corev1.Pod, running int) {
	t.Helper()
	var list corev1.PodList
	if err := cluster.Client.List(context.Background(), &list, client.InNamespace(rc.Namespace), client.MatchingLabels{"ray.io/cluster": rc.Name}); err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		all = append(all, p)
		if p.Status.Phase == corev1.PodRunning {
			running++
		}
	}
	return all, running
}

// KubeRay's own samples on the simulated cluster: the manager installs
// KubeRay's CRD itself, the pods run, the Services have KubeRay's names and
// the status is right. Then a scale-up interrupted by a manager restart
// leaves exactly the pods asked for.
func TestRayClustersOnTheSimulatedCluster(t *testing.T) {
	ctx := context.Background()
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "ray-node", Count: 4}); err != nil {
		t.Fatal(err)
	}
	// No Volcano scheduler runs here: gangs go to the kube-scheduler.
	_, m := startLoomManager(t, "--gang-scheduler=none")
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := cluster.Client.Get(ctx, client.ObjectKey{Name: "rayclusters.ray.io"}, crd); err != nil {
		t.Fatalf("the manager did not install KubeRay's CRD: %v", err)
	}
	ns := "ray-team"
	if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	samples := []string{"ray-cluster.sample.yaml", "ray-cluster.autoscaler.yaml", "ray-cluster.complete.yaml"}
	var rcs []*rayv1.RayCluster
	for _, s := range samples {
		rc := kuberaySample(t, s, ns)
		if err := cluster.Client.Create(ctx, rc); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		rcs = append(rcs, rc)
	}
	for i, rc := range rcs {
		got := &rayv1.RayCluster{}
		eventually(t, 90*time.Second, func() (bool, string) {
			if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(rc), got); err != nil {
				return false, err.Error()
			}
			return got.Status.State == rayv1.Ready, fmt.Sprintf("%s: state %q, %d/%d workers ready, conditions %+v", samples[i], got.Status.State, got.Status.ReadyWorkerReplicas, got.Status.DesiredWorkerReplicas, got.Status.Conditions)
		})
		pods, running := livePods(t, rc)
		if int32(len(pods)) != 1+got.Status.DesiredWorkerReplicas || running != len(pods) {
			t.Errorf("%s: %d pods (%d running), want 1 + %d", samples[i], len(pods), running, got.Status.DesiredWorkerReplicas)
		}
		svc := &corev1.Service{}
		if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: rc.Name + "-head-svc"}, svc); err != nil {
			t.Errorf("%s: head Service: %v", samples[i], err)
		}
		if got.Status.Head.PodIP == "" || got.Status.Head.ServiceName != rc.Name+"-head-svc" || got.Status.Endpoints["dashboard"] != "8265" {
			t.Errorf("%s: head status %+v endpoints %v", samples[i], got.Status.Head, got.Status.Endpoints)
		}
	}

	// Scale the first sample to 12 workers and kill the manager mid-way.
	rc := rcs[0]
	got := rc.DeepCopy()
	updateSpec(t, got, func(got *rayv1.RayCluster) {
		got.Spec.WorkerGroupSpecs[0].MaxReplicas = ptr.To[int32](20)
		got.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](12)
	})
	eventually(t, 30*time.Second, func() (bool, string) {
		pods, _ := livePods(t, rc)
		return len(pods) > 2, fmt.Sprintf("%d pods", len(pods))
	})
	m.Stop(20 * time.Second)
	_, _ = startLoomManager(t, "--gang-scheduler=none")
	eventually(t, 90*time.Second, func() (bool, string) {
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(rc), got); err != nil {
			return false, err.Error()
		}
		pods, _ := livePods(t, rc)
		return got.Status.State == rayv1.Ready && len(pods) == 13, fmt.Sprintf("state %q, %d pods", got.Status.State, len(pods))
	})
	time.Sleep(3 * time.Second)
	if pods, _ := livePods(t, rc); len(pods) != 13 {
		t.Fatalf("%d pods after the restarted scale-up settled, want 13", len(pods))
	}

	// Deleting a RayCluster removes its pods and Services (owner references).
	if err := cluster.Client.Delete(ctx, rcs[1]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		pods, _ := livePods(t, rcs[1])
		err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: rcs[1].Name + "-head-svc"}, &corev1.Service{})
		return len(pods) == 0 && apierrors.IsNotFound(err), fmt.Sprintf("%d pods, service err %v", len(pods), err)
	})
}
