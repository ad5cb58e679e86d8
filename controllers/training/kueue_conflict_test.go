package training

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/optional"
	"github.com/loom-dev/loom/internal/testenv"
)

// A Workload Kueue wrote since the cache read it refuses Loom's guarded
// patch (409 Conflict). That is no trouble of the job's: its status says
// what the pass decided (here, suspended), not CreateFailed quoting the
// conflict, and the pass runs again shortly, when the patch goes through.
func TestKueueWorkloadConflictIsNotTheJobsTrouble(t *testing.T) {
	installWorkloadCRD(t)
	ns := namespace(t, "kueue-conflict")
	m := startManager(t)
	job, _ := runAdmitted(t, ns, "busy")
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	setSuspend(t, job, true)

	// A reconciler of its own, as after a restart, whose first Workload
	// patch meets a newer Workload.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca, err := cache.New(env.Config, cache.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	conflicts := 1
	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	intercepted := interceptor.NewClient(direct, interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
		if obj.GetObjectKind().GroupVersionKind().Kind == kueue.WorkloadGVK.Kind && conflicts > 0 {
			conflicts--
			return apierrors.NewConflict(schema.GroupResource{Group: kueue.WorkloadGVK.Group, Resource: "workloads"}, obj.GetName(), fmt.Errorf("the object has been modified"))
		}
		return c.Patch(ctx, obj, p, opts...)
	}})
	// Reads from the cache, writes through the interceptor, as the
	// manager's client.
	c, err := client.New(env.Config, client.Options{Scheme: manager.Scheme(), Cache: &client.CacheOptions{Reader: ca}})
	if err != nil {
		t.Fatal(err)
	}
	c = cachedReads{Client: intercepted, cache: c}
	opts := manager.DefaultOptions()
	opts.GangScheduler = "none"
	r := newReconciler(c, env.Client, &events.FakeRecorder{}, opts)
	if err := r.pods.IndexCache(ctx, ca); err != nil {
		t.Fatal(err)
	}
	r.volcano = &gang.Volcano{Client: c, Cache: ca, Owner: &trainingv1alpha1.TrainingJob{}, Scheme: manager.Scheme()}
	r.kueue = &kueueJobs{cache: ca, live: env.Client, client: c, kind: &optional.Kind{CRD: kueue.WorkloadCRD, GVK: kueue.WorkloadGVK}}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		got := &trainingv1alpha1.TrainingJob{}
		if err := ca.Get(ctx, client.ObjectKeyFromObject(job), got); err != nil {
			return err
		}
		if !got.Spec.RunPolicy.Suspend {
			return fmt.Errorf("the cache has not seen the suspension")
		}
		return nil
	})

	pass := func() ctrl.Result {
		t.Helper()
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(job)})
		if err != nil {
			t.Fatalf("a pass whose Workload patch met a conflict failed: %v", err)
		}
		return res
	}
	// Passes until the one whose Workload patch is refused.
	var res ctrl.Result
	for i := 0; i < 10 && conflicts > 0; i++ {
		res = pass()
		time.Sleep(200 * time.Millisecond) // the cache catches up with the pass's writes
	}
	if conflicts > 0 {
		t.Fatal("no pass patched the suspended job's Workload")
	}
	if res.RequeueAfter == 0 || res.RequeueAfter > conflictRetry {
		t.Errorf("the pass that met a conflict looks again after %v, want at most %v", res.RequeueAfter, conflictRetry)
	}
	got := getJob(t, job)
	for _, typ := range []string{trainingv1alpha1.ConditionReady, trainingv1alpha1.ConditionCreated} {
		if c := cond(got, typ); c.Reason == ReasonCreateFailed {
			t.Errorf("%s says the Workload conflict: %+v", typ, c)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		pass()
		w, _, err := parsedWorkloadOf(t, job)
		if err != nil {
			return err
		}
		if w.Active() {
			return fmt.Errorf("the Workload is still active")
		}
		return nil
	})
}

// cachedReads reads through cache and writes through Client.
type cachedReads struct {
	client.Client
	cache client.Client
}

func (c cachedReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.cache.Get(ctx, key, obj, opts...)
}

func (c cachedReads) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.cache.List(ctx, list, opts...)
}
