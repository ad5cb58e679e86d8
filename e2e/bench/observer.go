package bench

import (
	"context"
	"fmt"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// observer is what the benchmark polls while a contender converges: an
// informer per kind it counts (RayClusters, pods) in one namespace, started
// on the first count of that kind, so that a poll reads the benchmark's own
// cache and the API server only sends it the changes, as it sends them to
// any controller. Listing the objects at every poll instead (1,000
// RayClusters every 250 ms, some 6 MB of JSON a list for the API server to
// encode) loaded the machine under test, and more the longer a contender
// took.
type observer struct {
	cache cache.Cache
	stop  context.CancelFunc
	done  chan struct{}
}

// observe starts an observer of namespace ns; close it when the run ends.
func (e *Env) observe(ctx context.Context, ns string) (*observer, error) {
	// Uncompressed: a watch the API server streams gzipped costs it a
	// compression of every event, which is no part of what is measured.
	cfg := rest.CopyConfig(e.Cluster.Config)
	cfg.DisableCompression = true
	c, err := cache.New(cfg, cache.Options{
		Scheme:            e.Cluster.Client.Scheme(),
		DefaultNamespaces: map[string]cache.Config{ns: {}},
		DefaultTransform:  cache.TransformStripManagedFields(),
	})
	if err != nil {
		return nil, fmt.Errorf("benchmark's cache: %w", err)
	}
	ctx, stop := context.WithCancel(ctx)
	o := &observer{cache: c, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		_ = c.Start(ctx)
	}()
	if !c.WaitForCacheSync(ctx) {
		o.close()
		return nil, fmt.Errorf("benchmark's cache did not start")
	}
	return o, nil
}

// close stops the observer's informers (their watches end).
func (o *observer) close() {
	o.stop()
	<-o.done
}

// readyRayClusters counts the RayClusters whose status.state is ready.
func (o *observer) readyRayClusters(ctx context.Context) (int, error) {
	var list rayv1.RayClusterList
	if err := o.cache.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return 0, err
	}
	ready := 0
	for i := range list.Items {
		if list.Items[i].Status.State == rayv1.Ready {
			ready++
		}
	}
	return ready, nil
}

// pods counts the pods that match opts, and of them those running.
func (o *observer) pods(ctx context.Context, opts ...client.ListOption) (all, running int, err error) {
	var list corev1.PodList
	if err := o.cache.List(ctx, &list, append(opts, client.UnsafeDisableDeepCopy)...); err != nil {
		return 0, 0, err
	}
	for i := range list.Items {
		if list.Items[i].Status.Phase == corev1.PodRunning {
			running++
		}
	}
	return len(list.Items), running, nil
}
