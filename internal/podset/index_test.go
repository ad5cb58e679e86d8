package podset_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/podset"
)

// List from the controller index gives what a List through the cache does:
// the owner's pods with the labels, not another owner's in the namespace,
// not a pod it does not control, not one without the labels.
func TestListByControllerIndex(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "podset-index"
	a := owner(t, ns)
	b := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns}}
	if err := env.Client.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	var all []*corev1.Pod
	all = append(all, pods(a, "a", 3, false)...)
	all = append(all, pods(a, "unlabelled", 1, false)...)
	all = append(all, pods(b, "b", 2, false)...)
	strangers := pods(a, "stranger", 1, false)
	strangers[0].OwnerReferences[0].Controller = nil // owned, not controlled
	all = append(all, strangers...)
	for _, p := range all {
		if p.Labels["set"] != "unlabelled" {
			p.Labels["set"] = "x"
		}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}

	c, err := cache.New(env.Config, cache.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cached, err := client.New(env.Config, client.Options{Scheme: manager.Scheme(), Cache: &client.CacheOptions{Reader: c}})
	if err != nil {
		t.Fatal(err)
	}
	plain := podset.New(cached, env.Client, &recorded{}, nil)
	indexed := podset.New(cached, env.Client, &recorded{}, nil)
	again := podset.New(cached, env.Client, &recorded{}, nil)
	for _, e := range []*podset.Executor{indexed, again} { // the second finds the index there
		if err := e.IndexCache(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	inf, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	if shared, ok := inf.(toolscache.SharedIndexInformer); !ok {
		t.Fatalf("the pod informer is a %T, not a shared index informer: List would not use the index", inf)
	} else if _, ok := shared.GetIndexer().GetIndexers()[podset.ControllerIndex]; !ok {
		t.Fatal("no controller index on the pod informer")
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}

	names := func(e *podset.Executor, o client.Object) []string {
		t.Helper()
		ps, err := e.List(ctx, o, client.MatchingLabels{"set": "x"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		slices.Sort(out)
		return out
	}
	want := map[client.Object][]string{a: {"a-0", "a-1", "a-2"}, b: {"b-0", "b-1"}}
	deadline := time.Now().Add(10 * time.Second)
	for o, w := range want {
		for !slices.Equal(names(plain, o), w) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		for _, e := range []*podset.Executor{plain, indexed, again} {
			if got := names(e, o); !slices.Equal(got, w) {
				t.Errorf("%s's pods: %v, want %v", o.GetName(), got, w)
			}
		}
	}
}

// A created pod is expected only until the informer shows it: the
// executor's copy of it goes at the pod's watch event, with no pass of its
// owner in between (owners converging together pass seconds apart).
func TestCreatedPodsExpectedUntilTheCacheShowsThem(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "podset-observed"
	o := owner(t, ns)
	c, err := cache.New(env.Config, cache.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cached, err := client.New(env.Config, client.Options{Scheme: manager.Scheme(), Cache: &client.CacheOptions{Reader: c}})
	if err != nil {
		t.Fatal(err)
	}
	e := podset.New(cached, env.Client, &recorded{}, nil)
	if err := e.IndexCache(ctx, c); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	want := pods(o, "new", 3, true)
	if res, err := e.Sync(ctx, o, nil, want); err != nil || res.Created != 3 {
		t.Fatalf("created %d: %v", res.Created, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.Expected(o) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := e.Expected(o); n != 0 {
		t.Fatalf("%d created pods still expected after the cache showed them, with no pass in between", n)
	}
}
