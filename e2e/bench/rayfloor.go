package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/common"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/e2e/framework"
)

// rayFloor is the raycluster scenario's floor: the requests any operator
// must send for a RayCluster to be ready, from a client without a rate
// limit and with nothing else in the way. For each RayCluster it is told of
// (an informer, as an operator is), it creates the head Service and the pods
// KubeRay's own builders make, 32 creates in flight in all; once all of a
// cluster's pods run and are ready (an informer on the pods), it patches the
// cluster's status.state to ready, once. No cache, no events, no other
// status: one create per pod and Service and one status write per cluster.
type rayFloor struct {
	cs     *kubernetes.Clientset
	rc     client.Client
	slots  chan struct{}
	writes atomic.Int64
	wg     sync.WaitGroup
	cancel func()
	shut   []func()

	mu      sync.Mutex
	err     error
	pods    map[string]int             // cluster -> pods it has
	ready   map[string]map[string]bool // cluster -> its ready pods
	written map[string]bool            // cluster -> status written
}

// startRayFloor starts the floor on namespace ns; stop ends it. It watches through informers (a list, then a watch that is
// resumed when the API server ends it), as an operator does.
func startRayFloor(ctx context.Context, c *framework.Cluster, ns string) (f *rayFloor, err error) {
	f = &rayFloor{slots: make(chan struct{}, 32), pods: map[string]int{}, ready: map[string]map[string]bool{}, written: map[string]bool{}}
	if f.cs, err = kubernetes.NewForConfig(floorConfig(c, true)); err != nil {
		return nil, err
	}
	// RayClusters are JSON (a CRD).
	if f.rc, err = client.New(floorConfig(c, false), client.Options{Scheme: c.Client.Scheme(), Mapper: c.Client.RESTMapper()}); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(floorConfig(c, false))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	pods := informers.NewSharedInformerFactoryWithOptions(f.cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = utils.RayClusterLabelKey }))
	clusters := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	onPod := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			f.onPod(ctx, p)
		}
	}
	_, err1 := pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onPod, UpdateFunc: func(_, obj any) { onPod(obj) }})
	_, err2 := clusters.ForResource(rayv1.SchemeGroupVersion.WithResource("rayclusters")).Informer().AddEventHandler(
		cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) { f.onCluster(ctx, obj) }})
	if err := errors.Join(err1, err2); err != nil {
		cancel()
		return nil, err
	}
	pods.Start(ctx.Done())
	clusters.Start(ctx.Done())
	pods.WaitForCacheSync(ctx.Done())
	clusters.WaitForCacheSync(ctx.Done())
	f.cancel, f.shut = cancel, []func(){pods.Shutdown, clusters.Shutdown}
	return f, nil
}

// stop ends the floor (again: a no-op) and returns its writes and its
// first error.
func (f *rayFloor) stop() (int, error) {
	f.cancel()
	for _, shut := range f.shut {
		shut()
	}
	f.wg.Wait()
	return int(f.writes.Load()), f.failed()
}

// onCluster builds a new cluster's head Service and pods and creates them.
func (f *rayFloor) onCluster(ctx context.Context, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	rc := &rayv1.RayCluster{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, rc); err != nil {
		f.fail(err)
		return
	}
	objs, err := floorChildren(ctx, rc)
	if err != nil {
		f.fail(err)
		return
	}
	f.mu.Lock()
	f.pods[rc.Name] = len(objs) - 1
	f.mu.Unlock()
	for _, o := range objs {
		f.do(func() error {
			var err error
			switch o := o.(type) {
			case *corev1.Service:
				_, err = f.cs.CoreV1().Services(rc.Namespace).Create(ctx, o, metav1.CreateOptions{})
			case *corev1.Pod:
				_, err = f.cs.CoreV1().Pods(rc.Namespace).Create(ctx, o, metav1.CreateOptions{})
			}
			return err
		})
	}
}

// onPod counts a cluster's ready pods and writes its status once all are.
func (f *rayFloor) onPod(ctx context.Context, p *corev1.Pod) {
	name := p.Labels[utils.RayClusterLabelKey]
	f.mu.Lock()
	if f.ready[name] == nil {
		f.ready[name] = map[string]bool{}
	}
	if p.Status.Phase == corev1.PodRunning && podReady(p) {
		f.ready[name][p.Name] = true
	} else {
		delete(f.ready[name], p.Name)
	}
	done := !f.written[name] && f.pods[name] > 0 && len(f.ready[name]) == f.pods[name]
	if done {
		f.written[name] = true
	}
	f.mu.Unlock()
	if !done {
		return
	}
	f.do(func() error {
		rc := &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: name}}
		return f.rc.Status().Patch(ctx, rc, client.RawPatch(types.MergePatchType, []byte(`{"status":{"state":"ready"}}`)))
	})
}

// do runs one write in the background, in one of the 32 slots.
func (f *rayFloor) do(write func() error) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.slots <- struct{}{}
		defer func() { <-f.slots }()
		if err := write(); err != nil {
			f.fail(err)
			return
		}
		f.writes.Add(1)
	}()
}

func (f *rayFloor) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = fmt.Errorf("the floor: %w", err)
	}
}

func (f *rayFloor) failed() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// floorChildren are the head Service and the pods of rc as KubeRay's own
// builders make them (the same calls as its operator and Loom's
// controller), each owned by rc: the Service first.
func floorChildren(ctx context.Context, rc *rayv1.RayCluster) ([]client.Object, error) {
	owner := []metav1.OwnerReference{*metav1.NewControllerRef(rc, rayv1.SchemeGroupVersion.WithKind("RayCluster"))}
	svc, err := common.BuildServiceForHeadPod(ctx, *rc, nil, nil)
	if err != nil {
		return nil, err
	}
	svc.OwnerReferences = owner
	out := []client.Object{svc}
	fqdn := utils.GenerateFQDNServiceName(ctx, *rc, rc.Namespace)
	headPort := common.GetHeadPort(rc.Spec.HeadGroupSpec.RayStartParams)
	autoscale := utils.IsAutoscalingEnabled(&rc.Spec)
	add := func(tmpl corev1.PodTemplateSpec, kind rayv1.RayNodeType, params map[string]string) {
		pod := common.BuildPod(ctx, tmpl, kind, params, headPort, autoscale, utils.RayClusterCRD, fqdn, nil)
		pod.Namespace, pod.OwnerReferences = rc.Namespace, owner
		out = append(out, &pod)
	}
	head := rc.Spec.HeadGroupSpec.DeepCopy()
	add(common.DefaultHeadPodTemplate(ctx, *rc, *head, utils.PodName(rc.Name, rayv1.HeadNode, true), headPort), rayv1.HeadNode, head.RayStartParams)
	for i := range rc.Spec.WorkerGroupSpecs {
		n := 1
		if r := rc.Spec.WorkerGroupSpecs[i].Replicas; r != nil {
			n = int(*r)
		}
		for range n {
			g := rc.Spec.WorkerGroupSpecs[i].DeepCopy() // the builders write into its template and params
			name := utils.PodName(fmt.Sprintf("%s-%s", rc.Name, g.GroupName), rayv1.WorkerNode, true)
			add(common.DefaultWorkerPodTemplate(ctx, *rc, *g, name, fqdn, headPort, "", 0, 0), rayv1.WorkerNode, g.RayStartParams)
		}
	}
	return out, nil
}
