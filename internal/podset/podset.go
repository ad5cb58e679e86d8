// Package podset creates and deletes the pods of a workload (a TrainingJob's
// gang, a RayCluster's head and workers) the way Kubernetes' own workload
// controllers do: a slow start capped per pass, expectations recorded
// before each call so that a lagging cache neither creates a pod twice nor
// mistakes a fresh one for a lost one, deletes guarded by the pod's UID, and
// one event and one condition message for a failed pass.
package podset

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/expect"
)

// PerPass is the most pods one pass creates or deletes: a larger set is
// finished by the passes that follow, so one huge object cannot hold a
// worker for minutes (1,024 calls take about 3.4 s at the manager's default
// client limit, QPS 300). It is twice the Job controller's burst of 500, so
// that a gang of up to 1,024 pods is created in one pass: a second pass
// cost a status write and a requeue (about 0.25 s of a 512-pod gang's 4 s).
const PerPass = 1024

// FirstBatch is the slow start's first window: a quota or an admission
// webhook that refuses every pod stops the pass after this many calls.
// Kubernetes' ReplicaSet and Job controllers start at 1 and double in
// batches, each waiting for its slowest call; here each call that succeeds
// opens the window by one, so it doubles every round trip with no barrier
// between rounds. 8 (a node's worth of a gang, a RayCluster's head and
// workers) creates a small set in one round trip.
const FirstBatch = 8

// inFlight is how many calls run at once; the client's rate limiter is the
// real bound.
const inFlight = 64

// MaxMessage is the longest condition message the API accepts.
const MaxMessage = apply.MaxConditionMessage

// MaxNote is the longest event note the API accepts (events.k8s.io/v1).
const MaxNote = 1024

// Again is how soon a pass that deferred pods (PerPass reached) should be
// followed by the next one.
const Again = 100 * time.Millisecond

// Executor creates and deletes one controller's pods.
type Executor struct {
	Client client.Client
	// Live reads a pod around the cache when a create answers
	// AlreadyExists, to tell the owner's own pod from a stranger's; nil
	// reads through Client.
	Live     client.Reader
	Recorder recorder.EventRecorder
	// Same tells whether an existing pod is the one created under its
	// name (names may repeat across a gang's attempts); nil: a name match
	// suffices.
	Same func(existing, created *corev1.Pod) bool

	exp *expect.Pods
	// byOwner is the pod cache's index by controller (IndexCache); nil:
	// List lists through Client.
	byOwner toolscache.Indexer
}

// ControllerIndex is the index IndexCache adds to the pod cache: a pod's
// controlling owner's UID.
const ControllerIndex = "loom.dev/controller-uid"

// IndexCache has List read an owner's pods from c's pod informer by their
// controller's UID, adding ControllerIndex to it unless another executor
// has. A pass then looks at its own pods only, not at every pod in the
// namespace with a label match (1,000 RayClusters in one namespace are
// 4,000 pods to filter on each pass of each), and takes them without the
// copy into a list that a List from the cache makes of each. A cache that
// is not one shared informer for pods (one of several namespaces) keeps
// List listing through Client.
func (e *Executor) IndexCache(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("the pod informer: %w", err)
	}
	shared, ok := inf.(toolscache.SharedIndexInformer)
	if !ok {
		return nil
	}
	if _, have := shared.GetIndexer().GetIndexers()[ControllerIndex]; !have {
		if err := shared.AddIndexers(toolscache.Indexers{ControllerIndex: controllerUID}); err != nil {
			return fmt.Errorf("indexing pods by controller: %w", err)
		}
	}
	// A created pod's expectation is dropped as soon as the informer has
	// it, not at the owner's next pass.
	if _, err := shared.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: e.observed}); err != nil {
		return fmt.Errorf("watching pods for the executor's creates: %w", err)
	}
	e.byOwner = shared.GetIndexer()
	return nil
}

// observed drops the expectation of a pod the informer added.
func (e *Executor) observed(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if ref := metav1.GetControllerOfNoCopy(p); ref != nil {
		e.exp.Observed(types.NamespacedName{Namespace: p.Namespace, Name: ref.Name}, p, e.Same)
	}
}

// Expected is how many pods the executor created for owner that its cache
// has not shown yet.
func (e *Executor) Expected(owner client.Object) int {
	return e.exp.Expected(client.ObjectKeyFromObject(owner))
}

// controllerUID is ControllerIndex's function.
func controllerUID(obj any) ([]string, error) {
	o, ok := obj.(metav1.Object)
	if !ok {
		return nil, nil
	}
	if ref := metav1.GetControllerOfNoCopy(o); ref != nil {
		return []string{string(ref.UID)}, nil
	}
	return nil, nil
}

// New returns an executor with empty expectations.
func New(c client.Client, live client.Reader, rec recorder.EventRecorder, same func(existing, created *corev1.Pod) bool) *Executor {
	return &Executor{Client: c, Live: live, Recorder: rec, Same: same, exp: expect.New()}
}

// Observe returns the owner's cached pods as the executor knows them to be:
// pods it deleted are terminating, pods it created that the cache lacks are
// there.
func (e *Executor) Observe(owner client.Object, cached []*corev1.Pod, now time.Time) []*corev1.Pod {
	return e.exp.Overlay(client.ObjectKeyFromObject(owner), owner.GetUID(), cached, now, e.Same)
}

// List lists the pods in owner's namespace that carry the labels match and
// that owner controls, from the pod cache's controller index when
// IndexCache set it up, else through Client (the cache), and returns them as
// Observe does. The pods are the cache's own objects, not copies (a pass over a
// gang of 512 pods otherwise spends most of its time copying them): read
// them, never change them; copy one before changing it.
func (e *Executor) List(ctx context.Context, owner client.Object, match client.MatchingLabels, now time.Time) ([]*corev1.Pod, error) {
	if e.byOwner != nil {
		objs, err := e.byOwner.ByIndex(ControllerIndex, string(owner.GetUID()))
		if err != nil {
			return nil, err
		}
		sel := labels.SelectorFromSet(labels.Set(match))
		cached := make([]*corev1.Pod, 0, len(objs))
		for _, o := range objs {
			if p, ok := o.(*corev1.Pod); ok && p.Namespace == owner.GetNamespace() && sel.Matches(labels.Set(p.Labels)) && metav1.IsControlledBy(p, owner) {
				cached = append(cached, p)
			}
		}
		return e.Observe(owner, cached, now), nil
	}
	var pods corev1.PodList
	if err := e.Client.List(ctx, &pods, client.InNamespace(owner.GetNamespace()), match, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	cached := make([]*corev1.Pod, 0, len(pods.Items))
	for i := range pods.Items {
		if metav1.IsControlledBy(&pods.Items[i], owner) {
			cached = append(cached, &pods.Items[i])
		}
	}
	return e.Observe(owner, cached, now), nil
}

// Forget drops the owner's expectations (the owner is gone).
func (e *Executor) Forget(owner client.Object) { e.exp.Forget(client.ObjectKeyFromObject(owner)) }

// Result is what one pass did.
type Result struct {
	Created, Deleted int
	// Deferred pods wait for the next pass (PerPass reached).
	Deferred int
}

// RequeueAfter is when the caller should look again: the soonest of its
// own times (0: none) and, when this pass deferred pods, Again; 0 when
// there is no reason to.
func (r Result) RequeueAfter(after ...time.Duration) time.Duration {
	if r.Deferred > 0 {
		after = append(after, Again)
	}
	var soonest time.Duration
	for _, d := range after {
		if d > 0 && (soonest == 0 || d < soonest) {
			soonest = d
		}
	}
	return soonest
}

// Sync deletes remove, then creates create: at most PerPass calls in all,
// creates in a slow start from FirstBatch calls in flight, so that a quota
// or admission error stops after a few calls instead of hundreds. A failed
// pass records one Warning event on owner and returns one error, whose
// Message fits a condition.
func (e *Executor) Sync(ctx context.Context, owner client.Object, remove, create []*corev1.Pod) (Result, error) {
	var res Result
	remove, deferDel := capped(remove, PerPass)
	create, deferCreate := capped(create, PerPass-len(remove))
	res.Deferred = deferDel + deferCreate
	deleted, err := e.delete(ctx, owner, remove)
	res.Deleted = deleted
	if err == nil {
		res.Created, err = e.create(ctx, owner, create)
	}
	if err != nil {
		e.Recorder.Eventf(owner, nil, corev1.EventTypeWarning, reasonOf(err), actionOf(err), "%s", apply.Truncate(err.Error(), MaxNote))
	}
	return res, err
}

func capped(pods []*corev1.Pod, n int) ([]*corev1.Pod, int) {
	n = max(n, 0)
	if len(pods) <= n {
		return pods, 0
	}
	return pods[:n], len(pods) - n
}

// CreateError and DeleteError carry a failed pass's first errors.
type CreateError struct{ err error }

func (e *CreateError) Error() string { return e.err.Error() }
func (e *CreateError) Unwrap() error { return e.err }

type DeleteError struct{ err error }

func (e *DeleteError) Error() string { return e.err.Error() }
func (e *DeleteError) Unwrap() error { return e.err }

func reasonOf(err error) string {
	var d *DeleteError
	if errors.As(err, &d) {
		return "FailedDeletePod"
	}
	return "FailedCreatePod"
}

func actionOf(err error) string {
	if reasonOf(err) == "FailedDeletePod" {
		return "Delete"
	}
	return "Create"
}

// Message is err as a condition message: the API's length limit applies.
func Message(err error) string { return apply.Truncate(err.Error(), MaxMessage) }

func (e *Executor) create(ctx context.Context, owner client.Object, pods []*corev1.Pod) (int, error) {
	n, err := slowStart(pods, func(p *corev1.Pod) error { return e.createOne(ctx, owner, p) })
	if err != nil {
		return n, &CreateError{err}
	}
	if n > 0 {
		log.FromContext(ctx).V(1).Info("created pods", "owner", client.ObjectKeyFromObject(owner), "count", n)
	}
	return n, nil
}

// slowStart calls f for each pod, FirstBatch at first and one more for each
// call that succeeds, so the window doubles every round trip (TCP's slow
// start) up to inFlight, with no barrier between rounds: a call starts as
// soon as one ends. After the first error no call starts; those in flight
// finish. It returns how many succeeded and the errors joined.
func slowStart(pods []*corev1.Pod, f func(*corev1.Pod) error) (int, error) {
	var (
		mu      sync.Mutex
		wake    = sync.NewCond(&mu)
		window  = FirstBatch
		running int
		done    int
		errs    []error
		wg      sync.WaitGroup
	)
	for _, p := range pods {
		mu.Lock()
		for len(errs) == 0 && running >= min(window, inFlight) {
			wake.Wait()
		}
		if len(errs) > 0 {
			mu.Unlock()
			break
		}
		running++
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := f(p)
			mu.Lock()
			defer mu.Unlock()
			running--
			if err != nil {
				errs = append(errs, err)
			} else {
				done++
				window++
			}
			wake.Broadcast()
		}()
	}
	wg.Wait()
	return done, errors.Join(errs...)
}

// createOne records the expectation, then creates. A generated name is
// chosen here, so that the expectation knows it before the call.
func (e *Executor) createOne(ctx context.Context, owner client.Object, p *corev1.Pod) error {
	key := client.ObjectKeyFromObject(owner)
	pod := p.DeepCopy()
	if pod.Name == "" && pod.GenerateName != "" {
		pod.Name = pod.GenerateName + utilrand.String(5)
	}
	e.exp.Created(key, pod, time.Now())
	err := e.Client.Create(ctx, pod.DeepCopy())
	// A create whose answer was lost may have made the pod: it stays
	// expected until the cache shows it or expect.TTL passes, so that the
	// next pass does not make a second one under another generated name.
	// A refusal made nothing.
	lost := err != nil && answerLost(err)
	if apierrors.IsAlreadyExists(err) {
		err = e.alreadyExists(ctx, owner, pod)
	}
	if err != nil {
		if !lost {
			e.exp.CreateFailed(key, pod.Name)
		}
		return fmt.Errorf("creating pod %s: %w", pod.Name, err)
	}
	return nil
}

// answerLost: err does not say whether the server stored the object: the
// API server answered that it timed out (it may have written to etcd
// before), or no answer came at all (the connection broke, the API server
// restarted mid-request). A status the server answered otherwise, or a
// connection refused before the request was sent, says nothing was made.
func answerLost(err error) bool {
	if apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) {
		return true
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return false
	}
	return !utilnet.IsConnectionRefused(err)
}

// ConflictError: a create answered AlreadyExists and the pod of that name
// is not the owner's to use: a stranger's (the owner does not control it)
// or, with Executor.Same, an earlier attempt's. The executor never deletes
// or rewrites it; the caller reports the name conflict (it needs a person,
// or the earlier pod to finish terminating). Sync returns it wrapped (in a
// CreateError); find it with IsConflict or errors.As.
type ConflictError struct {
	// Namespace and Pod name the existing pod.
	Namespace, Pod string
	// Owner is the name of the object that wanted the pod.
	Owner string
	// EarlierAttempt: the owner controls the pod but Same says it is not
	// the one this create made (an earlier attempt's); false: the owner
	// does not control it.
	EarlierAttempt bool
	// EarlierOwner: the pod is controlled by an earlier object of the
	// owner's kind and name, deleted since (the owner was deleted and
	// created again); the garbage collector removes it.
	EarlierOwner bool
}

func (e *ConflictError) Error() string {
	switch {
	case e.EarlierAttempt:
		return fmt.Sprintf("pod %s of an earlier attempt still exists", e.Pod)
	case e.EarlierOwner:
		return fmt.Sprintf("pod %s of the %s deleted before this one still exists: it is created once the garbage collector has removed it", e.Pod, e.Owner)
	}
	return fmt.Sprintf("pod %s exists and is not controlled by %s: rename or delete it", e.Pod, e.Owner)
}

// Stranger: the pod is neither the owner's (an earlier attempt's) nor an
// earlier owner's of the same name, which go by themselves: only a person
// can free the name.
func (e *ConflictError) Stranger() bool { return !e.EarlierAttempt && !e.EarlierOwner }

// IsConflict reports whether err is (or wraps) a ConflictError: a pod name
// taken by a pod that is not the owner's. (Not an API 409 Conflict:
// apierrors.IsConflict is that.)
func IsConflict(err error) bool {
	var c *ConflictError
	return errors.As(err, &c)
}

// alreadyExists decides whether a pod of the name is the owner's own,
// created before a restart (fine: the cache will show it), or not (a
// ConflictError).
func (e *Executor) alreadyExists(ctx context.Context, owner client.Object, want *corev1.Pod) error {
	live := e.Live
	if live == nil {
		live = e.Client
	}
	have := &corev1.Pod{}
	if err := live.Get(ctx, client.ObjectKeyFromObject(want), have); err != nil {
		return fmt.Errorf("pod %s exists but cannot be read: %w", want.Name, err)
	}
	conflict := &ConflictError{Namespace: want.Namespace, Pod: want.Name, Owner: owner.GetName()}
	if !metav1.IsControlledBy(have, owner) {
		if ref := metav1.GetControllerOfNoCopy(want); ref != nil && apply.Predecessor(have, *ref) {
			conflict.EarlierOwner = true
		}
		return conflict
	}
	if e.Same != nil && !e.Same(have, want) {
		conflict.EarlierAttempt = true
		return conflict
	}
	return nil
}

// delete deletes pods (each guarded by its UID, in the background) and
// records the expectations. A pod the cache does not show yet is left for
// the pass that sees it.
func (e *Executor) delete(ctx context.Context, owner client.Object, pods []*corev1.Pod) (int, error) {
	key := client.ObjectKeyFromObject(owner)
	var deleted atomic.Int64
	err := apply.Each(pods, inFlight, func(p *corev1.Pod) error {
		if p.UID == "" {
			return nil // created but not in the cache yet
		}
		uid := p.UID
		err := e.Client.Delete(ctx, p, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			e.exp.Deleted(key, uid, time.Now())
			deleted.Add(1)
			return nil
		}
		if answerLost(err) {
			// It may be deleted: expected so until the cache says or
			// expect.TTL passes, so that the next pass does not choose
			// another pod to delete in its place.
			e.exp.Deleted(key, uid, time.Now())
		}
		return fmt.Errorf("deleting pod %s: %w", p.Name, err)
	})
	if err != nil {
		return int(deleted.Load()), &DeleteError{err}
	}
	if n := deleted.Load(); n > 0 {
		log.FromContext(ctx).V(1).Info("deleted pods", "owner", key, "count", n)
	}
	return int(deleted.Load()), nil
}

// Ready reports whether the pod's Ready condition is True.
func Ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitingWhy is the first container of a pod (init containers first) that
// waits for a reason other than its creation, and the kubelet's words; or,
// for a pod not placed, the scheduler's.
func WaitingWhy(p *corev1.Pod) string {
	if p.Spec.NodeName == "" {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
				return "not placed: " + c.Message
			}
		}
		return ""
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			w := cs.State.Waiting
			if w == nil || w.Reason == "" || w.Reason == "ContainerCreating" || w.Reason == "PodInitializing" {
				continue
			}
			why := "container " + cs.Name + " waits: " + w.Reason
			if w.Message != "" {
				why += ": " + w.Message
			}
			return why
		}
	}
	return ""
}
