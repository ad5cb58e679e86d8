package inventory

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

// Feed keeps idx up to date from the manager's shared Node, GPUNode and
// Pod informers: every add, update and delete is applied as it arrives, so
// the index is never rebuilt. The Node informer is the typed one (the
// index reads allocatable, taints and the Ready condition); the manager's
// cache trims what it holds of a Node with TrimNode. The ClusterPolicy in
// force and its device plugin ConfigMap (in namespace, Loom's) give the
// sharing configs (Index.SetSharing); when they rename a GPU resource,
// every Node and pod of the cache is set again.
func Feed(ctx context.Context, c cache.Cache, idx *Index, namespace string) error {
	resync := func() {
		if idx.SetSharing(sharingSource(ctx, c, namespace)) {
			var nodes corev1.NodeList
			if err := c.List(ctx, &nodes); err == nil {
				for i := range nodes.Items {
					idx.SetNode(&nodes.Items[i])
				}
			}
			var pods corev1.PodList
			if err := c.List(ctx, &pods); err == nil {
				for i := range pods.Items {
					idx.SetPod(&pods.Items[i])
				}
			}
		}
	}
	for _, obj := range []client.Object{&gpuv1alpha1.ClusterPolicy{}, &corev1.ConfigMap{}} {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("%T informer: %w", obj, err)
		}
		changed := func(o any) {
			if m, ok := unwrap(o).(client.Object); ok && (m.GetNamespace() == "" || m.GetNamespace() == namespace) {
				resync()
			}
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: changed, UpdateFunc: func(_, o any) { changed(o) }, DeleteFunc: changed,
		}); err != nil {
			return err
		}
	}
	ni, err := c.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return fmt.Errorf("node informer: %w", err)
	}
	if _, err := ni.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { setNode(idx, o) },
		UpdateFunc: func(_, o any) { setNode(idx, o) },
		DeleteFunc: func(o any) {
			if n, ok := unwrap(o).(*corev1.Node); ok {
				idx.DeleteNode(n.Name)
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

// sharingSource is the device plugin configs of the ClusterPolicy in force
// (none without one), read from the cache.
func sharingSource(ctx context.Context, c client.Reader, namespace string) sharing.Source {
	var list gpuv1alpha1.ClusterPolicyList
	if err := c.List(ctx, &list); err != nil {
		return sharing.Source{Namespace: namespace}
	}
	src, _ := sharing.Read(ctx, c, gpuv1alpha1.Active(list.Items), namespace)
	return src
}

// TrimNode is the Node cache's transform: of a typed Node it keeps what
// the index reads (name, labels, spec.unschedulable, taints, the Ready
// condition's status, GPU resources' capacity and allocatable) and drops
// the rest (images, addresses, node info, managed fields: most of a
// Node's size). Node metadata (PartialObjectMetadata, the GPU stack's
// reconcilers' informer) passes whole but for managed fields. Nothing
// reads a typed Node from the cache for anything else; a writer that
// needs the whole Node reads it from the API server.
func TrimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		if m, ok := obj.(metav1.Object); ok && m.GetManagedFields() != nil {
			m.SetManagedFields(nil)
		}
		return obj, nil
	}
	out := &corev1.Node{TypeMeta: n.TypeMeta, ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID,
		ResourceVersion: n.ResourceVersion, Labels: n.Labels, DeletionTimestamp: n.DeletionTimestamp}}
	out.Spec.Unschedulable, out.Spec.Taints = n.Spec.Unschedulable, n.Spec.Taints
	out.Status.Capacity, out.Status.Allocatable = NVIDIAResources(n.Status.Capacity), NVIDIAResources(n.Status.Allocatable)
	if c := ReadyCondition(n); c != nil {
		out.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
	}
	return out, nil
}

// NVIDIAResources is the nvidia.com/ resources of l; nil when none. The
// cache keeps them all: which are GPUs depends on the sharing configs (a
// rename may be any nvidia.com/ name), which may change after the object
// is cached.
func NVIDIAResources(l corev1.ResourceList) corev1.ResourceList {
	var out corev1.ResourceList
	for name, q := range l {
		if strings.HasPrefix(string(name), sharing.ResourcePrefix) {
			if out == nil {
				out = corev1.ResourceList{}
			}
			out[name] = q
		}
	}
	return out
}

func setNode(idx *Index, o any) {
	if n, ok := o.(*corev1.Node); ok {
		idx.SetNode(n)
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
// every reconciler of the manager reads the same one. namespace is Loom's
// (where the device plugin ConfigMap is).
func Shared(ctx context.Context, c cache.Cache, namespace string) (*Index, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if idx, ok := shared[c]; ok {
		return idx, nil
	}
	idx := NewIndex()
	if err := Feed(ctx, c, idx, namespace); err != nil {
		return nil, err
	}
	shared[c] = idx
	return idx, nil
}
