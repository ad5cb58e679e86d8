package nodelabels

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/testenv"
)

func createGPUNode(t *testing.T, name string) *gpuv1alpha1.GPUNode {
	t.Helper()
	gn := &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := env.Client.Create(context.Background(), gn); err != nil {
		t.Fatal(err)
	}
	return gn
}

// ownedByOnly waits until GPUNode name has exactly one owner reference:
// node's, which the garbage collector deletes it with.
func ownedByOnly(t *testing.T, name string, node *corev1.Node) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() error {
		gn := &gpuv1alpha1.GPUNode{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, gn); err != nil {
			return err
		}
		want := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
		if len(gn.OwnerReferences) != 1 || gn.OwnerReferences[0] != want {
			return fmt.Errorf("owner references %+v, want only %+v", gn.OwnerReferences, want)
		}
		return nil
	})
}

func gone(t *testing.T, name string, uid types.UID) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() error {
		gn := &gpuv1alpha1.GPUNode{}
		err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, gn)
		if apierrors.IsNotFound(err) || (err == nil && gn.UID != uid) {
			return nil
		}
		return fmt.Errorf("GPUNode %s (uid %s) still there (err %v)", name, uid, err)
	})
}

// A GPUNode lives as long as its Node: one that exists without an owner
// reference (made before the manager ran, after an upgrade) is given its
// Node's; one whose Node is gone is deleted, owned or not (the garbage
// collector deletes only the owned ones, and envtest has none); and a Node
// re-added under the same name (a new UID) owns the GPUNode made for it,
// and only that Node does, even when the old one's reference is still
// there.
func TestGPUNodeLivesAsLongAsItsNode(t *testing.T) {
	ctx := context.Background()
	startManager(t)

	// Upgrade: a GPUNode without an owner reference gets its Node's.
	kept := createNode(t, "owner-kept", nil)
	createGPUNode(t, kept.Name)
	ownedByOnly(t, kept.Name, kept)

	// Left over: no Node, no owner reference.
	orphan := createGPUNode(t, "owner-orphan")
	gone(t, orphan.Name, orphan.UID)

	// Made again at once under that name, as the agent of a Node deleted
	// while it still runs puts its GPUNode back: not deleted again within
	// the minute, so the two do not delete and create it in a loop.
	again := createGPUNode(t, orphan.Name)
	time.Sleep(2 * time.Second)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(again), again); err != nil || again.DeletionTimestamp != nil {
		t.Errorf("a GPUNode made again for a deleted Node was deleted at once: %v, deleting %v", err, again.DeletionTimestamp)
	}

	// The Node deleted: its GPUNode goes.
	node := createNode(t, "owner-readded", nil)
	gn := createGPUNode(t, node.Name)
	ownedByOnly(t, node.Name, node)
	if err := env.Client.Delete(ctx, node); err != nil {
		t.Fatal(err)
	}
	gone(t, gn.Name, gn.UID)

	// Re-added, with a new UID: the agent's new GPUNode is the new Node's.
	readded := createNode(t, node.Name, nil)
	createGPUNode(t, node.Name)
	ownedByOnly(t, node.Name, readded)

	// Re-added before the old GPUNode went (the garbage collector had not
	// come to it yet): the old Node's reference is replaced, so the
	// collector does not delete the GPUNode now the new Node's.
	stale := &unstructured.Unstructured{}
	stale.SetAPIVersion(gpuv1alpha1.GroupVersion.String())
	stale.SetKind("GPUNode")
	stale.SetName(kept.Name)
	stale.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: kept.Name, UID: "a-deleted-node"}})
	if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(stale), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	ownedByOnly(t, kept.Name, kept)

	// The kept Node's GPUNode was never deleted.
	cur := &gpuv1alpha1.GPUNode{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: kept.Name}, cur); err != nil || cur.DeletionTimestamp != nil {
		t.Errorf("the GPUNode of a Node that stays: %v, deleting %v", err, cur.DeletionTimestamp)
	}
}
