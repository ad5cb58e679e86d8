// Package training reconciles TrainingJobs: a gang of master and worker pods
// behind one headless Service, scheduled together through a Volcano PodGroup
// (or not at all), restarted as a whole on a retryable failure.
//
// A pass observes the job's pods (cache plus expectations), its PodGroup and
// the GPU inventory; decide (decide.go) turns that into the next status and
// the changes to make, in ordered pure phases; the PodGroup, the Service and
// the status are written through one apply.Writer, the pods created and
// deleted through one podset.Executor.
package training

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/optional"
	"github.com/loom-dev/loom/internal/podset"
	"github.com/loom-dev/loom/internal/preflight"
)

// FieldOwner is the server-side-apply field manager of the training
// reconciler.
const FieldOwner = "loom-training"

// +kubebuilder:rbac:groups=training.loom.dev,resources=trainingjobs,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=training.loom.dev,resources=trainingjobs/status,verbs=get;patch
// +kubebuilder:rbac:groups=training.loom.dev,resources=trainingjobs/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=scheduling.volcano.sh,resources=podgroups,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=scheduling.volcano.sh,resources=queues,verbs=get;list;watch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch

// Reconciler reconciles TrainingJobs.
type Reconciler struct {
	client.Client
	APIReader        client.Reader
	Recorder         recorder.EventRecorder
	DefaultScheduler trainingv1alpha1.GangScheduler
	Index            *inventory.Index
	// MaxPods is the most pods one job may ask for (--max-workload-pods);
	// a bigger job is held.
	MaxPods int

	// writer writes the job's children and status; pods creates and
	// deletes its pods.
	writer  *apply.Writer
	pods    *podset.Executor
	volcano *gang.Volcano
	kueue   *kueueJobs
}

// Setup registers the training reconciler with the manager.
func Setup(ctx context.Context, mgr ctrl.Manager, opts manager.Options) error {
	idx, err := inventory.Shared(ctx, mgr.GetCache(), opts.Namespace)
	if err != nil {
		return err
	}
	r := newReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("loom-training"), opts)
	r.Index = idx
	if err := r.pods.IndexCache(ctx, mgr.GetCache()); err != nil {
		return err
	}
	inventoryChanged := make(chan ctrlevent.GenericEvent, 64)
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named("trainingjob").
		// Labels name the Kueue LocalQueue and priority class; an edit of
		// them leaves the generation as it was and is still seen.
		For(&trainingv1alpha1.TrainingJob{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		Owns(&corev1.Pod{}).
		Owns(&corev1.Service{}).
		WatchesMetadata(&apiextensionsv1.CustomResourceDefinition{},
			handler.EnqueueRequestsFromMapFunc(r.heldJobs),
			builder.WithPredicates(isCRD)).
		WatchesRawSource(source.Channel(inventoryChanged, &handler.EnqueueRequestForObject{})).
		Build(r)
	if err != nil {
		return err
	}
	r.volcano = &gang.Volcano{Client: r.Client, Cache: mgr.GetCache(), Controller: c, Owner: &trainingv1alpha1.TrainingJob{}, Scheme: mgr.GetScheme(),
		QueueUsers: r.queueJobs}
	if opts.Kueue {
		if r.kueue, err = newKueueJobs(r.Client, r.APIReader, mgr.GetCache(), c, mgr.GetScheme(), opts.KueueLabelKeysToCopy, r.jobsWhere); err != nil {
			return err
		}
		r.kueue.manageUnnamed = opts.KueueManageJobsWithoutQueueName
	}
	registerMetrics(mgr.GetCache())
	return mgr.Add(ctrlmanager.RunnableFunc(func(ctx context.Context) error {
		return r.watchInventory(ctx, inventoryChanged)
	}))
}

// newReconciler is a reconciler writing through c, reading around the cache
// through live, without the inventory and Volcano watch Setup adds.
func newReconciler(c client.Client, live client.Reader, rec recorder.EventRecorder, opts manager.Options) *Reconciler {
	r := &Reconciler{
		Client:           c,
		APIReader:        live,
		Recorder:         rec,
		DefaultScheduler: trainingv1alpha1.GangScheduler(opts.GangScheduler),
		MaxPods:          opts.MaxWorkloadPods,
	}
	// The cache holds only Loom's Services: the writer reads around it
	// before creating the job's, never to apply over a user's.
	r.writer = apply.NewWriter(r.Client, FieldOwner, apply.Options{Live: r.APIReader, Conditions: conditions, SpecOnly: []schema.GroupKind{gang.PodGroupKind}})
	r.pods = podset.New(r.Client, r.APIReader, r.Recorder, sameAttempt)
	return r
}

// isCRD selects the CRDs whose installation a job may wait for: Volcano's,
// and Kueue's Workload (a queued job waits for it to be served) and
// WorkloadPriorityClass (a queued job held on the class it names: the
// class's watch starts with it).
var isCRD = predicate.Or(gang.IsCRD, optional.IsCRD(kueue.WorkloadCRD, kueue.WorkloadPriorityClassCRD))

// heldJobs lists the jobs that wait for Volcano's or Kueue's CRDs: held
// ones (the PodGroup CRD) and unscheduled ones (the Queue CRD: their queue
// is checked from then on; Kueue's Workload and WorkloadPriorityClass
// CRDs: a queued job is unscheduled until admitted).
func (r *Reconciler) heldJobs(ctx context.Context, _ client.Object) []ctrl.Request {
	return r.jobsWhere(ctx, func(j *trainingv1alpha1.TrainingJob) bool {
		return j.Status.State == trainingv1alpha1.StateHeld || (!j.Status.Finished() && !condTrue(&j.Status, trainingv1alpha1.ConditionScheduled))
	})
}

// queueJobs lists the unscheduled jobs that name a Volcano queue, when it
// is created, opened or closed.
func (r *Reconciler) queueJobs(ctx context.Context, queue string) []ctrl.Request {
	return r.jobsWhere(ctx, func(j *trainingv1alpha1.TrainingJob) bool {
		return j.Spec.Queue() == queue && !j.Status.Finished() && !condTrue(&j.Status, trainingv1alpha1.ConditionScheduled)
	})
}

// watchInventory re-evaluates the unscheduled jobs when GPUs change (a node
// added or lost, GPUs freed), at most every two seconds, without polling:
// a job whose verdict changed (it fits now, it waits, it can never fit) is
// written, and its pending gauges follow the free GPUs. The status carries
// no live numbers (inventory.FitResult's Message), so a pass whose verdict
// holds writes nothing: 500 waiting jobs cost no write per GPU freed.
func (r *Reconciler) watchInventory(ctx context.Context, out chan<- ctrlevent.GenericEvent) error {
	changed := r.Index.Subscribe()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(apply.CoalesceInterval):
		}
		for _, req := range r.jobsWhere(ctx, func(j *trainingv1alpha1.TrainingJob) bool {
			return !j.Status.Finished() && !condTrue(&j.Status, trainingv1alpha1.ConditionScheduled)
		}) {
			job := &trainingv1alpha1.TrainingJob{ObjectMeta: metav1.ObjectMeta{Name: req.Name, Namespace: req.Namespace}}
			select {
			case out <- ctrlevent.GenericEvent{Object: job}:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

func (r *Reconciler) jobsWhere(ctx context.Context, keep func(*trainingv1alpha1.TrainingJob) bool) []ctrl.Request {
	var list trainingv1alpha1.TrainingJobList
	if err := r.List(ctx, &list); err != nil {
		return nil
	}
	var out []ctrl.Request
	for i := range list.Items {
		if keep(&list.Items[i]) {
			out = append(out, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// Reconcile observes a job's pods, PodGroup and the inventory, decides,
// and applies the decision: status first when it records a restart or an
// end (see urgent), so that a crash between the two never loses it.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	job := &trainingv1alpha1.TrainingJob{}
	if err := r.Get(ctx, req.NamespacedName, job); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.forget(req.NamespacedName)
		return ctrl.Result{}, r.kueue.releaseGone(ctx, req.NamespacedName, r.writer)
	}
	if job.DeletionTimestamp != nil {
		return ctrl.Result{}, r.kueue.releaseGone(ctx, req.NamespacedName, r.writer)
	}
	if labelled, err := r.kueue.defaultQueue(ctx, job); err != nil || labelled {
		if err != nil {
			return statusFailed(err)
		}
		return ctrl.Result{}, nil
	}
	obs, err := r.observe(ctx, job, time.Now())
	if errors.Is(err, gang.ErrNotServedYet) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	return r.execute(ctx, job, obs, decide(job, obs, r.DefaultScheduler))
}

// execute carries out a decision: an urgent status, the events and
// metrics, the job's deletion past its TTL, the children and pods, then the
// status with what applying them said.
func (r *Reconciler) execute(ctx context.Context, job *trainingv1alpha1.TrainingJob, obs observed, d decision) (ctrl.Result, error) {
	first := urgent(job, &d)
	if first {
		if _, err := r.writeStatus(ctx, job, &d.status); err != nil {
			return statusFailed(err)
		}
	}
	r.record(job, &d)
	gaugePending(job, &d.status, obs.fit)
	if d.deleteJob {
		return ctrl.Result{}, r.writer.Delete(ctx, job, "ttlSecondsAfterFinished has passed")
	}
	res, applyErr := r.applyChildren(ctx, job, obs, &d)
	if applyErr == nil {
		applyErr = r.syncWorkload(ctx, job, obs, &d)
	}
	res.Deferred += d.deferred
	// A child written since the cache read it (Kueue writes its Workload's
	// status) refuses a guarded write: the job's trouble it is not, and the
	// pass runs again shortly from a fresher copy, so the status says
	// nothing of it.
	conflict := apierrors.IsConflict(applyErr)
	if conflict {
		applyErr = nil
	}
	applied(&d.status, applyErr, job.Generation, obs.now)
	if first && applyErr != nil {
		// The status was written from this copy of the job already; the
		// next pass, from a fresh one, says what failed.
		return ctrl.Result{}, applyErr
	}
	wait, err := r.writeStatus(ctx, job, &d.status)
	if err := errors.Join(applyErr, err); err != nil {
		if applyErr == nil {
			return statusFailed(err)
		}
		return ctrl.Result{}, err
	}
	after := res.RequeueAfter(d.requeue, wait)
	if conflict && (after == 0 || after > conflictRetry) {
		after = conflictRetry
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// record records the decision's events and metrics.
func (r *Reconciler) record(job *trainingv1alpha1.TrainingJob, d *decision) {
	for _, e := range d.events {
		kind := corev1.EventTypeNormal
		if e.warning {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(job, nil, kind, e.reason, "Reconcile", "%s", e.msg)
	}
	if d.restarted {
		gangRestarts.WithLabelValues(job.Namespace).Inc()
	}
	if d.scheduledAfter > 0 {
		gangScheduled.Observe(d.scheduledAfter.Seconds())
	}
}

// forget drops what the writer and the pod executor remember of a job that
// is gone.
func (r *Reconciler) forget(key client.ObjectKey) {
	gone := &trainingv1alpha1.TrainingJob{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}
	r.pods.Forget(gone)
	r.writer.Forget(gone)
	forgetPending(key.Namespace, key.Name)
}

// observe reads the job's pods and PodGroup from the cache and asks the
// inventory whether the gang fits (not for a job over the pod limit: it is
// held, and the fit's cost grows with its pods).
func (r *Reconciler) observe(ctx context.Context, job *trainingv1alpha1.TrainingJob, now time.Time) (observed, error) {
	obs := observed{now: now, maxPods: r.MaxPods}
	var err error
	if obs.pods, err = r.pods.List(ctx, job, client.MatchingLabels{LabelJobName: job.Name}, now); err != nil {
		return obs, err
	}
	if obs.podGroup, obs.volcano, err = r.volcano.Group(ctx, job, job.Name); err != nil {
		return obs, err
	}
	if obs.taken, err = r.taken(ctx, job, obs.pods); err != nil {
		return obs, err
	}
	obs.refused = r.preflight(ctx, job, obs)
	if err = r.kueue.observe(ctx, job, &obs); err != nil {
		return obs, err
	}
	if obs.service, err = r.service(ctx, job); err != nil {
		return obs, err
	}
	if obs.volcano && !condTrue(&job.Status, trainingv1alpha1.ConditionScheduled) {
		if obs.queue, err = r.volcano.Queue(ctx, job.Spec.Queue()); err != nil {
			return obs, err
		}
	}
	if _, g := gangGPUs(job); len(g.Groups) > 0 && !condTrue(&job.Status, trainingv1alpha1.ConditionScheduled) && totalPods(job) <= int64(maxPods(r.MaxPods)) {
		obs.fit = r.Index.Fits(g)
	} else {
		obs.fit = inventory.FitResult{Verdict: inventory.FitsNow}
	}
	return obs, nil
}

// preflight asks the API server, with a dry run, whether it admits one
// pod of each role, while the job is not finished and lacks pods (before
// its first gang, and its Service and PodGroup, are made; a converged job
// asks nothing): the fields of what it refuses as invalid, "" when it
// refuses none (or cannot say). Jobs the limit or invalid phases hold
// already are not asked. Each role's pod is built as rank 0 of attempt 0:
// a pod's ordinals and attempt are not what the API server refuses.
func (r *Reconciler) preflight(ctx context.Context, job *trainingv1alpha1.TrainingJob, obs observed) string {
	total := totalPods(job)
	if job.Status.Finished() || total > int64(maxPods(r.MaxPods)) || int64(len(ownPods(job, obs.pods))) >= total || len(templateErrors(job)) > 0 {
		return ""
	}
	fw := frameworks[job.Spec.Framework]
	sched, _ := scheduler(job, r.DefaultScheduler, obs.volcano)
	var refused []string
	for _, role := range roles {
		if replicaSpec(job, role) == nil || replicas(job, role) == 0 {
			continue
		}
		pod := buildPod(job, fw, role, 0, 0, sched)
		path := "spec.replicaSpecs." + string(role) + ".template"
		if why := preflight.Refused(ctx, r.Client, job.Name, path, pod); why != "" {
			refused = append(refused, why)
		}
	}
	return strings.Join(refused, "; ")
}

// taken says which pod name of the gang, by rank, a stranger's pod holds
// (one the job does not control, and not a deleted job's of its name,
// which the garbage collector removes), "" when none does. It is asked,
// from the cache, which holds every pod, only while the job is not
// finished and has no pod: before its attempt's PodGroup, Workload or
// pods are made (once some are, the pod executor reports a name taken).
func (r *Reconciler) taken(ctx context.Context, job *trainingv1alpha1.TrainingJob, pods []*corev1.Pod) (string, error) {
	if job.Status.Finished() || totalPods(job) > int64(maxPods(r.MaxPods)) || len(ownPods(job, pods)) > 0 {
		return "", nil
	}
	ref := ownerRef(job)
	for _, role := range roles {
		for i := range replicas(job, role) {
			pod := &corev1.Pod{}
			if err := r.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: PodName(job.Name, role, i)}, pod); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return "", err
			}
			if !metav1.IsControlledBy(pod, job) && !apply.Predecessor(pod, ref) {
				return fmt.Sprintf("pod %s exists and is not controlled by %s: rename the job, or delete the pod", pod.Name, job.Name), nil
			}
		}
	}
	return "", nil
}

// service is the job's Service from the cache (which holds only Loom's),
// if the job controls it.
func (r *Reconciler) service(ctx context.Context, job *trainingv1alpha1.TrainingJob) (*corev1.Service, error) {
	svc := &corev1.Service{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: job.Name}, svc); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(svc, job) {
		return nil, nil
	}
	return svc, nil
}

// applyChildren makes the PodGroup, the Service and the pods what the
// decision says, through the writer and the pod executor.
func (r *Reconciler) applyChildren(ctx context.Context, job *trainingv1alpha1.TrainingJob, obs observed, d *decision) (podset.Result, error) {
	if d.removeService && obs.service != nil {
		if err := r.writer.Delete(ctx, obs.service, "the job has finished and its pods are cleaned: no pod is left to resolve"); err != nil {
			return podset.Result{}, err
		}
	}
	if d.removePodGroup && obs.podGroup != nil {
		if err := r.writer.Delete(ctx, obs.podGroup, "no longer desired"); err != nil {
			return podset.Result{}, err
		}
	}
	// The Service first: a name a stranger holds stops the pass before
	// the PodGroup, which Volcano enqueues (reserving its queue's
	// resources for a gang that cannot start).
	for _, c := range d.children {
		if err := r.writer.Ensure(ctx, job, c); err != nil {
			if apply.IsForeign(err) {
				err = fmt.Errorf("%w: rename the job or the %s", err, c.GetObjectKind().GroupVersionKind().Kind)
			}
			return podset.Result{}, err
		}
	}
	if d.podGroup != nil {
		if err := r.writer.Ensure(ctx, job, d.podGroup); err != nil {
			return podset.Result{}, err
		}
	}
	return r.pods.Sync(ctx, job, d.remove, d.create)
}

// writeStatus writes the job's status through the writer, guarded by the
// job's resourceVersion: the attempt and restart counters must never be
// computed from a stale copy. A change of counts and messages only waits
// for the coalescing interval (the returned duration).
func (r *Reconciler) writeStatus(ctx context.Context, job *trainingv1alpha1.TrainingJob, st *trainingv1alpha1.TrainingJobStatus) (time.Duration, error) {
	wait, err := r.writer.Status(ctx, job, &job.Status, st, apply.CountsOnly(countsOnly(&job.Status, st)), apply.Guarded())
	if err == nil && wait == 0 {
		job.Status = *st.DeepCopy()
	}
	return wait, err
}

// statusFailed is the result of a failed status write: a conflict (the
// cached job is older than the server's) is looked at again shortly, with
// a fresher copy; any other error is returned.
func statusFailed(err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	return ctrl.Result{}, err
}

// conflictRetry is how soon a pass whose status write met a newer job runs
// again (the cache catches up within milliseconds).
const conflictRetry = 250 * time.Millisecond

// sameAttempt: pod names repeat across attempts; only a pod of the attempt
// created satisfies the expectation.
func sameAttempt(cached, created *corev1.Pod) bool {
	return cached.Labels[LabelAttempt] == created.Labels[LabelAttempt]
}
