package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

func schemaGVK(group, version, kind string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: group, Version: version, Kind: kind}
}

// createPolicy creates cp and, when the test ends, deletes it and waits
// until its operand DaemonSets are gone, so the next test starts clean.
func createPolicy(t *testing.T, cp *gpuv1alpha1.ClusterPolicy) {
	t.Helper()
	ctx := context.Background()
	if err := cluster.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.Delete(ctx, cp)
		eventually(t, 60*time.Second, func() (bool, string) {
			list := &appsv1.DaemonSetList{}
			_ = cluster.Client.List(ctx, list, client.InNamespace(loomNS), client.MatchingLabels{"app.kubernetes.io/managed-by": "loom"})
			return len(list.Items) == 0, fmt.Sprintf("%d operand DaemonSets left", len(list.Items))
		})
	})
}

// testNodes creates simulated nodes for one test and deletes them when it
// ends, so that later tests (which share the cluster) do not find GPU nodes
// they did not ask for.
func testNodes(t *testing.T, spec framework.NodeSpec) []string {
	t.Helper()
	names, err := cluster.CreateNodes(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes(names) })
	return names
}

// updateSpec changes obj's live copy as a user's edit does: read it,
// change it, write it, and again on a conflict (its controller writes the
// status in between). obj is left as written.
func updateSpec[T client.Object](t *testing.T, obj T, change func(T)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cluster.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		change(obj)
		return cluster.Client.Update(context.Background(), obj)
	})
	if err != nil {
		t.Fatalf("updating %s: %v", client.ObjectKeyFromObject(obj), err)
	}
}

// testNode is testNodes for one named node.
func testNode(t *testing.T, name string, spec framework.NodeSpec) {
	t.Helper()
	if _, err := cluster.CreateNode(context.Background(), name, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes([]string{name}) })
}

func deleteNodes(names []string) {
	for _, n := range names {
		_ = cluster.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
}
