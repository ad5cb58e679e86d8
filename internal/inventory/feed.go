package inventory

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// Feed keeps idx up to date from the manager's shared GPUNode, Node
// (metadata only, the informer the GPU stack's reconcilers watch too) and
// Pod informers: every add, update and delete is applied as it arrives, so
// the index is never rebuilt. A GPUNode counts only while its Node exists
// (Index.RequireNodes).
func Feed(ctx context.Context, c cache.Cache, idx *Index) error {
	idx.RequireNodes()
	ni, err := c.GetInformer(ctx, nodeMetadata())
	if err != nil {
		return fmt.Errorf("node informer: %w", err)
	}
	if _, err := ni.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { setNode(idx, o) },
		UpdateFunc: func(_, o any) { setNode(idx, o) },
		DeleteFunc: func(o any) {
			if n, ok := unwrap(o).(metav1.Object); ok {
				idx.DeleteNode(n.GetName())
			}
		},
	}); err != nil {
		return err
	}
	gni, err := c.GetInformer(ctx, &gpuv1alpha1.GPUNode{})
	if err != nil {
		return fmt.Errorf("GPUNode informer: %w", err)
	}
	if _, err := gni.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { setGPUNode(idx, o) },
		UpdateFunc: func(_, o any) { setGPUNode(idx, o) },
		DeleteFunc: func(o any) {
			if gn, ok := unwrap(o).(*gpuv1alpha1.GPUNode); ok {
				idx.DeleteGPUNode(gn.Name)
			}
		},
	}); err != nil {
		return err
	}
	pi, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	_, err = pi.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { setPod(idx, o) },
		UpdateFunc: func(_, o any) { setPod(idx, o) },
		DeleteFunc: func(o any) {
			if p, ok := unwrap(o).(*corev1.Pod); ok {
				idx.DeletePod(p.UID)
			}
		},
	})
	return err
}

func nodeMetadata() *metav1.PartialObjectMetadata {
	n := &metav1.PartialObjectMetadata{}
	n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return n
}

func setNode(idx *Index, o any) {
	if n, ok := o.(metav1.Object); ok {
		idx.SetNode(n.GetName())
	}
}

func setGPUNode(idx *Index, o any) {
	if gn, ok := o.(*gpuv1alpha1.GPUNode); ok {
		idx.SetGPUNode(gn)
	}
}

func setPod(idx *Index, o any) {
	if p, ok := o.(*corev1.Pod); ok {
		idx.SetPod(p)
	}
}

func unwrap(o any) any {
	if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}

var (
	sharedMu sync.Mutex
	shared   = map[cache.Cache]*Index{}
)

// Shared returns the one Index of a manager's cache, fed from its informers;
// every reconciler of the manager reads the same one.
func Shared(ctx context.Context, c cache.Cache) (*Index, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if idx, ok := shared[c]; ok {
		return idx, nil
	}
	idx := NewIndex()
	if err := Feed(ctx, c, idx); err != nil {
		return nil, err
	}
	shared[c] = idx
	return idx, nil
}
