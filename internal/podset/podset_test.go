package podset_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/podset"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// recorded is a recorder that keeps every event.
type recorded struct {
	mu     sync.Mutex
	events []string
}

func (r *recorded) Eventf(_, _ runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, eventtype+" "+reason+" "+action+": "+fmt.Sprintf(note, args...))
}

func (r *recorded) AnnotatedEventf(regarding, related runtime.Object, _ map[string]string, eventtype, reason, action, note string, args ...any) {
	r.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

func (r *recorded) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// fastClient talks to the test API server without client-side throttling,
// counting the creates it sends; during each create, during is called.
func fastClient(t *testing.T, creates *atomic.Int64, during func(*corev1.Pod)) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return interceptor.NewClient(c, interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if p, ok := obj.(*corev1.Pod); ok {
			creates.Add(1)
			if during != nil {
				during(p)
			}
		}
		return c.Create(ctx, obj, opts...)
	}})
}

// owner is a fresh object in a fresh namespace whose UID makes a valid
// controller reference.
func owner(t *testing.T, ns string) *corev1.ConfigMap {
	t.Helper()
	ctx := context.Background()
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	o := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: ns}}
	if err := env.Client.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	return o
}

// pods builds n pods controlled by o: named <prefix>-<i>, or generated
// from <prefix>- when generate is set.
func pods(o client.Object, prefix string, n int, generate bool) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, n)
	for i := range n {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: o.GetNamespace(), Labels: map[string]string{"set": prefix},
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(o, corev1.SchemeGroupVersion.WithKind("ConfigMap"))}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}
		if generate {
			p.GenerateName = prefix + "-"
		} else {
			p.Name = fmt.Sprintf("%s-%d", prefix, i)
		}
		out = append(out, p)
	}
	return out
}

func live(t *testing.T, ns, set string) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{"set": set}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// A quota that admits 3 pods: of the first window (FirstBatch, 8) 5 fail;
// each of the 3 successes frees its own slot and widens the window by one,
// so it may have started two more calls before the first failure came
// back (at most FirstBatch+6 calls), and none starts after it. One Warning event for the
// pass; the failed pods' expectations are dropped.
func TestSlowStartStopsAfterAFailedBatch(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "slowstart")
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "three", Namespace: o.Namespace},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("3")}}}
	if err := env.Client.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	// No quota controller runs here: admission needs the status it keeps.
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
	if err := env.Client.Status().Update(ctx, quota); err != nil {
		t.Fatal(err)
	}
	var creates atomic.Int64
	rec := &recorded{}
	e := podset.New(fastClient(t, &creates, nil), env.Client, rec, nil)
	res, err := e.Sync(ctx, o, nil, pods(o, "q", 20, false))
	var ce *podset.CreateError
	if !errors.As(err, &ce) || !apierrors.IsForbidden(err) {
		t.Fatalf("error %v, want a CreateError from the quota", err)
	}
	if n := creates.Load(); res.Created != 3 || n < podset.FirstBatch || n > podset.FirstBatch+2*3 {
		t.Fatalf("created %d in %d calls, want 3 in %d to %d calls", res.Created, n, podset.FirstBatch, podset.FirstBatch+2*3)
	}
	if got := len(live(t, o.Namespace, "q")); got != 3 {
		t.Fatalf("%d pods exist, want 3", got)
	}
	if ev := rec.all(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning FailedCreatePod Create: ") || len(ev[0]) > podset.MaxNote+40 {
		t.Fatalf("events %q, want one FailedCreatePod", ev)
	}
	if seen := e.Observe(o, nil, time.Now()); len(seen) != 3 {
		t.Fatalf("expectations hold %d pods, want the 3 created", len(seen))
	}
}

// Every create's expectation is recorded before the call, a generated
// name included (chosen before the call, so that the cache's pod can be
// matched to it).
func TestExpectationsBeforeCreate(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "expect")
	var e *podset.Executor
	var creates atomic.Int64
	var missing atomic.Value
	c := fastClient(t, &creates, func(p *corev1.Pod) {
		if p.Name == "" {
			missing.Store("a pod was sent without a name")
			return
		}
		for _, q := range e.Observe(o, nil, time.Now()) {
			if q.Name == p.Name {
				return
			}
		}
		missing.Store("no expectation for " + p.Name + " during its create")
	})
	e = podset.New(c, env.Client, &recorded{}, nil)
	want := append(pods(o, "named", 3, false), pods(o, "gen", 4, true)...)
	res, err := e.Sync(ctx, o, nil, want)
	if err != nil || res.Created != 7 {
		t.Fatalf("created %d: %v", res.Created, err)
	}
	if m := missing.Load(); m != nil {
		t.Fatal(m)
	}
	// The cache shows nothing yet: the overlay shows all seven, once.
	if seen := e.Observe(o, nil, time.Now()); len(seen) != 7 {
		t.Fatalf("overlay shows %d pods, want 7", len(seen))
	}
	for _, p := range live(t, o.Namespace, "gen") {
		if !strings.HasPrefix(p.Name, "gen-") || p.GenerateName != "" && len(p.Name) != len("gen-")+5 {
			t.Fatalf("generated name %q", p.Name)
		}
	}
}

// AlreadyExists is fine for the owner's own pod (created before a
// restart), an error for a stranger's or, with Same, an earlier attempt's.
func TestAlreadyExists(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "exists")
	own := pods(o, "own", 1, false)[0]
	stranger := pods(o, "stranger", 1, false)[0]
	earlier := pods(o, "earlier", 1, false)[0]
	earlier.Labels["attempt"] = "0"
	for _, p := range []*corev1.Pod{own, earlier} {
		if err := env.Client.Create(ctx, p.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	s := stranger.DeepCopy()
	s.OwnerReferences = nil
	if err := env.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	var creates atomic.Int64
	sameAttempt := func(have, want *corev1.Pod) bool { return have.Labels["attempt"] == want.Labels["attempt"] }
	e := podset.New(fastClient(t, &creates, nil), env.Client, &recorded{}, sameAttempt)

	if res, err := e.Sync(ctx, o, nil, []*corev1.Pod{own}); err != nil || res.Created != 1 {
		t.Fatalf("the owner's own pod: created %d, %v", res.Created, err)
	}
	if _, err := e.Sync(ctx, o, nil, []*corev1.Pod{stranger}); err == nil || !strings.Contains(err.Error(), "is not controlled by owner") {
		t.Fatalf("a stranger's pod: %v", err)
	}
	next := earlier.DeepCopy()
	next.Labels["attempt"] = "1"
	if _, err := e.Sync(ctx, o, nil, []*corev1.Pod{next}); err == nil || !strings.Contains(err.Error(), "of an earlier attempt") {
		t.Fatalf("an earlier attempt's pod: %v", err)
	}
	for _, name := range []string{"stranger-0", "earlier-0"} {
		for _, p := range e.Observe(o, nil, time.Now()) {
			if p.Name == name {
				t.Fatalf("a failed create of %s is still expected", name)
			}
		}
	}
}

// At most PerPass calls a pass: the rest is Deferred, and the next pass
// creates it.
func TestPerPassCapDefers(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "cap")
	var creates atomic.Int64
	e := podset.New(fastClient(t, &creates, nil), env.Client, &recorded{}, nil)
	want := pods(o, "cap", podset.PerPass+3, false)
	res, err := e.Sync(ctx, o, nil, want)
	if err != nil || res.Created != podset.PerPass || res.Deferred != 3 || res.RequeueAfter() <= 0 {
		t.Fatalf("first pass %+v (requeue %s): %v", res, res.RequeueAfter(), err)
	}
	res, err = e.Sync(ctx, o, nil, want[podset.PerPass:])
	if err != nil || res.Created != 3 || res.Deferred != 0 || res.RequeueAfter() != 0 {
		t.Fatalf("second pass %+v: %v", res, err)
	}
	if n := len(live(t, o.Namespace, "cap")); n != podset.PerPass+3 {
		t.Fatalf("%d pods", n)
	}
}

// A delete carries the UID the caller saw: a pod recreated under the same
// name since is left alone, and the pass does not fail.
func TestDeleteIsGuardedByUID(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "uid")
	p := pods(o, "uid", 1, false)[0]
	old := p.DeepCopy()
	if err := env.Client.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, old.DeepCopy(), client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		fresh := p.DeepCopy()
		return env.Client.Create(ctx, fresh)
	})
	var creates atomic.Int64
	e := podset.New(fastClient(t, &creates, nil), env.Client, &recorded{}, nil)
	res, err := e.Sync(ctx, o, []*corev1.Pod{old}, nil)
	if err != nil || res.Deleted != 1 {
		t.Fatalf("deleting the replaced pod: %+v %v", res, err)
	}
	left := live(t, o.Namespace, "uid")
	if len(left) != 1 || left[0].UID == old.UID || left[0].DeletionTimestamp != nil {
		t.Fatalf("the recreated pod was touched: %+v", left)
	}
	// A pod the cache does not show yet (no UID) is left for a later pass.
	if res, err := e.Sync(ctx, o, pods(o, "uid", 1, false), nil); err != nil || res.Deleted != 0 {
		t.Fatalf("deleting a pod without a UID: %+v %v", res, err)
	}
}

// Messages fit a condition and notes an event, cut on a character boundary.
func TestMessageIsTruncated(t *testing.T) {
	short := errors.New("quota exceeded")
	if got := podset.Message(short); got != short.Error() {
		t.Fatalf("short message changed: %q", got)
	}
	long := errors.New(strings.Repeat("é", podset.MaxMessage)) // two bytes each
	got := podset.Message(long)
	if len(got) > podset.MaxMessage || !strings.HasSuffix(got, "…") || !utf8.ValidString(got) {
		t.Fatalf("truncated to %d bytes, valid UTF-8 %v, suffix %q", len(got), utf8.ValidString(got), got[len(got)-3:])
	}
}

// RequeueAfter is the soonest of the caller's times and, with deferred
// pods, Again.
func TestRequeueAfter(t *testing.T) {
	tests := []struct {
		deferred int
		after    []time.Duration
		want     time.Duration
	}{
		{0, nil, 0},
		{0, []time.Duration{0, 0}, 0},
		{0, []time.Duration{0, 3 * time.Second, time.Second}, time.Second},
		{2, nil, podset.Again},
		{2, []time.Duration{time.Hour}, podset.Again},
		{2, []time.Duration{time.Millisecond}, time.Millisecond},
	}
	for _, tt := range tests {
		if got := (podset.Result{Deferred: tt.deferred}).RequeueAfter(tt.after...); got != tt.want {
			t.Errorf("deferred %d, after %v: %s, want %s", tt.deferred, tt.after, got, tt.want)
		}
	}
}

// A name taken by a stranger's pod, or by an earlier attempt's, is a
// ConflictError naming the pod, found through Sync's wrapping; the pod is
// left exactly as it was.
func TestConflictError(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "conflict")
	stranger := pods(o, "taken", 1, false)[0]
	s := stranger.DeepCopy()
	s.OwnerReferences = nil
	if err := env.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	var creates atomic.Int64
	e := podset.New(fastClient(t, &creates, nil), env.Client, &recorded{}, nil)
	_, err := e.Sync(ctx, o, nil, []*corev1.Pod{stranger})
	var c *podset.ConflictError
	if !podset.IsConflict(err) || !errors.As(err, &c) || c.Pod != "taken-0" || c.Namespace != o.Namespace || c.Owner != o.Name || c.EarlierAttempt {
		t.Fatalf("error %v (%+v), want a ConflictError for taken-0", err, c)
	}
	if apierrors.IsAlreadyExists(err) || !strings.Contains(podset.Message(err), "taken-0") {
		t.Fatalf("message %q", podset.Message(err))
	}
	left := live(t, o.Namespace, "taken")
	if len(left) != 1 || left[0].UID != s.UID || left[0].ResourceVersion != s.ResourceVersion || left[0].DeletionTimestamp != nil {
		t.Fatalf("the stranger's pod was touched: %+v", left)
	}
	if podset.IsConflict(nil) || podset.IsConflict(errors.New("quota")) {
		t.Fatal("IsConflict of an error that is none")
	}
	earlier := &podset.ConflictError{Pod: "p", Owner: "o", EarlierAttempt: true}
	if !podset.IsConflict(fmt.Errorf("wrapped: %w", earlier)) || !strings.Contains(earlier.Error(), "of an earlier attempt") {
		t.Fatalf("earlier attempt: %v", earlier)
	}
}

// A create whose answer is lost (the API server timed out, or went away,
// after it stored the pod) may have made the pod: its expectation stays
// until the cache shows the pod or the TTL passes, so that the next pass
// does not create a second one under another generated name (a RayCluster
// with the autoscaler never removes the surplus). A create the server
// refused is forgotten at once.
func TestACreateWithALostAnswerStaysExpected(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "lost")
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	base, err := client.NewWithWatch(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	lost := []error{
		apierrors.NewTimeoutError("request did not complete within requested timeout - context deadline exceeded", 0),
		apierrors.NewServerTimeout(corev1.Resource("pods"), "create", 0),
		fmt.Errorf("Post \"https://api/api/v1/namespaces/lost/pods\": %w", io.ErrUnexpectedEOF),
		fmt.Errorf("Post \"https://api/api/v1/namespaces/lost/pods\": %w", syscall.ECONNRESET),
	}
	var next atomic.Int64
	c := interceptor.NewClient(base, interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if err := c.Create(ctx, obj, opts...); err != nil {
			return err
		}
		return lost[next.Add(1)-1] // stored, but the answer never came
	}})
	e := podset.New(c, env.Client, &recorded{}, nil)
	for i, want := range lost {
		if _, err := e.Sync(ctx, o, nil, pods(o, "gen", 1, true)); err == nil {
			t.Fatalf("create %d: no error, want %v", i, want)
		}
	}
	made := live(t, o.Namespace, "gen")
	if len(made) != len(lost) {
		t.Fatalf("%d pods made, want %d", len(made), len(lost))
	}
	seen := map[string]bool{}
	for _, p := range e.Observe(o, nil, time.Now()) {
		seen[p.Name] = true
	}
	for _, p := range made {
		if !seen[p.Name] {
			t.Fatalf("pod %s, created under a lost answer, is not expected: the next pass would create another", p.Name)
		}
	}
	// A refusal is no lost answer: nothing was made, nothing is expected.
	refused := podset.New(interceptor.NewClient(base, interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
		return apierrors.NewForbidden(corev1.Resource("pods"), "", errors.New("exceeded quota"))
	}}), env.Client, &recorded{}, nil)
	if _, err := refused.Sync(ctx, o, nil, pods(o, "refused", 1, true)); err == nil {
		t.Fatal("a refused create: no error")
	}
	if got := refused.Observe(o, nil, time.Now()); len(got) != 0 {
		t.Fatalf("a refused create is still expected: %d pods", len(got))
	}
}

// A delete whose answer was lost may have deleted the pod: it is
// expected terminating, so the next pass does not pick another pod to
// delete in its place (a scale-down by one deleting two).
func TestADeleteWithALostAnswerStaysExpected(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "lostdelete")
	base, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	e0 := podset.New(base, env.Client, &recorded{}, nil)
	if _, err := e0.Sync(ctx, o, nil, pods(o, "fixed", 2, false)); err != nil {
		t.Fatal(err)
	}
	made := live(t, o.Namespace, "fixed")
	if len(made) != 2 {
		t.Fatalf("%d pods made", len(made))
	}
	c := interceptor.NewClient(base, interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
		if err := c.Delete(ctx, obj, opts...); err != nil {
			return err
		}
		return apierrors.NewTimeoutError("request did not complete within requested timeout", 0) // deleted, answer lost
	}})
	e := podset.New(c, env.Client, &recorded{}, nil)
	if _, err := e.Sync(ctx, o, []*corev1.Pod{&made[0]}, nil); err == nil {
		t.Fatal("a delete with a lost answer: no error")
	}
	// The cache has not caught up: both pods still look alive there.
	var alive int
	for _, p := range e.Observe(o, []*corev1.Pod{&made[0], &made[1]}, time.Now()) {
		if p.DeletionTimestamp == nil {
			alive++
		}
	}
	if alive != 1 {
		t.Fatalf("%d pods alive after one was deleted under a lost answer, want 1: the next pass would delete another", alive)
	}
}

// A pod of an earlier owner of the same kind and name (deleted, then
// created again) is no stranger's: the garbage collector removes it.
func TestAnEarlierOwnersPodIsNoStranger(t *testing.T) {
	ctx := context.Background()
	o := owner(t, "earlierowner")
	p := pods(o, "prev", 1, false)[0]
	prev := p.DeepCopy()
	prev.OwnerReferences[0].UID = "uid-of-the-deleted-owner"
	if err := env.Client.Create(ctx, prev); err != nil {
		t.Fatal(err)
	}
	var creates atomic.Int64
	e := podset.New(fastClient(t, &creates, nil), env.Client, &recorded{}, nil)
	_, err := e.Sync(ctx, o, nil, []*corev1.Pod{p})
	var c *podset.ConflictError
	if !errors.As(err, &c) || !c.EarlierOwner || c.Stranger() || !strings.Contains(err.Error(), "deleted before this one") {
		t.Fatalf("error %v (%+v), want a ConflictError for an earlier owner's pod", err, c)
	}
	stranger := &podset.ConflictError{Pod: "p", Owner: "o"}
	if !stranger.Stranger() || (&podset.ConflictError{EarlierAttempt: true}).Stranger() {
		t.Fatal("Stranger")
	}
}
