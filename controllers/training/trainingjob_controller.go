// Package training reconciles TrainingJobs: a gang of master and worker pods
// behind one headless Service, scheduled together through a Volcano PodGroup
// (or not at all), restarted as a whole on a retryable failure.
package training

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/coalesce"
	"github.com/loom-dev/loom/internal/expect"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
)

// FieldOwner is the server-side-apply field manager of the training
// reconciler.
const FieldOwner = "loom-training"

// +kubebuilder:rbac:groups=training.loom.dev,resources=trainingjobs,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=training.loom.dev,resources=trainingjobs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=training.loom.dev,resources=trainingjobs/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=scheduling.volcano.sh,resources=podgroups,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch

// Reconciler reconciles TrainingJobs.
type Reconciler struct {
	client.Client
	APIReader        client.Reader
	Recorder         recorder.EventRecorder
	DefaultScheduler trainingv1alpha1.GangScheduler
	Index            *inventory.Index

	exp *expect.Pods

	writes  coalesce.Writes
	volcano *gang.Volcano
}

// Setup registers the training reconciler with the manager.
func Setup(ctx context.Context, mgr ctrl.Manager, opts manager.Options) error {
	idx, err := inventory.Shared(ctx, mgr.GetCache())
	if err != nil {
		return err
	}
	r := &Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		Recorder:         mgr.GetEventRecorder("loom-training"),
		DefaultScheduler: trainingv1alpha1.GangScheduler(opts.GangScheduler),
		Index:            idx,
		exp:              expect.New(),
	}
	inventoryChanged := make(chan event.GenericEvent, 64)
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named("trainingjob").
		For(&trainingv1alpha1.TrainingJob{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Pod{}).
		Owns(&corev1.Service{}).
		WatchesMetadata(&apiextensionsv1.CustomResourceDefinition{},
			handler.EnqueueRequestsFromMapFunc(r.heldJobs),
			builder.WithPredicates(gang.IsCRD)).
		WatchesRawSource(source.Channel(inventoryChanged, &handler.EnqueueRequestForObject{})).
		Build(r)
	if err != nil {
		return err
	}
	r.volcano = &gang.Volcano{Client: r.Client, Cache: mgr.GetCache(), Controller: c, Owner: &trainingv1alpha1.TrainingJob{}, Scheme: mgr.GetScheme()}
	registerMetrics(mgr.GetCache())
	return mgr.Add(ctrlmanager.RunnableFunc(func(ctx context.Context) error {
		return r.watchInventory(ctx, inventoryChanged)
	}))
}

// heldJobs lists the jobs that wait for the PodGroup CRD.
func (r *Reconciler) heldJobs(ctx context.Context, _ client.Object) []ctrl.Request {
	return r.jobsWhere(ctx, func(j *trainingv1alpha1.TrainingJob) bool { return j.Status.State == trainingv1alpha1.StateHeld })
}

// watchInventory re-evaluates the unscheduled jobs when GPUs change (a node
// added or lost, GPUs freed), at most every two seconds, so that their
// "needs N GPUs, M free" stays true without polling.
func (r *Reconciler) watchInventory(ctx context.Context, out chan<- event.GenericEvent) error {
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
		case <-time.After(coalesce.Interval):
		}
		for _, req := range r.jobsWhere(ctx, func(j *trainingv1alpha1.TrainingJob) bool {
			return !j.Status.Finished() && !condTrue(&j.Status, trainingv1alpha1.ConditionScheduled)
		}) {
			job := &trainingv1alpha1.TrainingJob{ObjectMeta: metav1.ObjectMeta{Name: req.Name, Namespace: req.Namespace}}
			select {
			case out <- event.GenericEvent{Object: job}:
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

// Reconcile observes a job's pods, PodGroup and the inventory, decides, and
// applies the decision: status first when it records a restart or an end,
// so that a crash between the two never loses it.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	job := &trainingv1alpha1.TrainingJob{}
	if err := r.Get(ctx, req.NamespacedName, job); err != nil {
		if apierrors.IsNotFound(err) {
			r.exp.Forget(req.NamespacedName)
			r.writes.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if job.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	now := time.Now()
	obs, err := r.observe(ctx, job, now)
	if errors.Is(err, gang.ErrNotServedYet) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	d := decide(job, obs, r.DefaultScheduler)

	urgent := d.restarted || (d.status.Finished() && !job.Status.Finished()) || d.status.State != job.Status.State
	if urgent {
		if err := r.writeStatus(ctx, job, &d.status); err != nil {
			return ctrl.Result{}, err
		}
	}
	if d.eventReason != "" {
		kind := corev1.EventTypeNormal
		if d.eventWarning {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(job, nil, kind, d.eventReason, "Reconcile", "%s", d.eventMessage)
	}
	if d.restarted {
		gangRestarts.WithLabelValues(job.Namespace).Inc()
	}
	if d.scheduledAfter > 0 {
		gangScheduled.Observe(d.scheduledAfter.Seconds())
	}
	if d.deleteJob {
		err := r.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	applyErr := r.applyChildren(ctx, job, obs, &d)
	if applyErr != nil {
		// Say on the job what stops it (a missing PriorityClass, a quota,
		// an admission webhook), not only in the manager's log.
		msg := applyErr.Error()
		if len(msg) > 1000 {
			msg = msg[:1000] + "…"
		}
		setCond(&d.status, trainingv1alpha1.ConditionCreated, metav1.ConditionFalse, ReasonCreateFailed, msg, job.Generation, now)
		setReady(&d.status, metav1.ConditionFalse, ReasonCreateFailed, msg, job.Generation, now)
	}
	errs := []error{applyErr}
	wait := time.Duration(0)
	if !urgent {
		var err error
		wait, err = r.writeStatusCoalesced(ctx, job, &d.status)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	requeue := d.requeue
	if wait > 0 && (requeue == 0 || wait < requeue) {
		requeue = wait
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// observe reads the job's pods and PodGroup from the cache and asks the
// inventory whether the gang fits.
func (r *Reconciler) observe(ctx context.Context, job *trainingv1alpha1.TrainingJob, now time.Time) (observed, error) {
	obs := observed{now: now}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(job.Namespace), client.MatchingLabels{LabelJobName: job.Name}); err != nil {
		return obs, err
	}
	cached := make([]*corev1.Pod, 0, len(pods.Items))
	for i := range pods.Items {
		if metav1.IsControlledBy(&pods.Items[i], job) {
			cached = append(cached, &pods.Items[i])
		}
	}
	obs.pods = r.exp.Overlay(client.ObjectKeyFromObject(job), cached, now, sameAttempt)

	var err error
	if obs.volcano, err = r.volcano.Installed(ctx); err != nil {
		return obs, err
	}
	if obs.volcano {
		pg := &schedulingv1beta1.PodGroup{}
		switch err := r.Get(ctx, client.ObjectKeyFromObject(job), pg); {
		case err == nil:
			if metav1.IsControlledBy(pg, job) {
				obs.podGroup = pg
			}
		case apierrors.IsNotFound(err):
		default:
			return obs, err
		}
	}
	if total, g := gangGPUs(job); total > 0 && !condTrue(&job.Status, trainingv1alpha1.ConditionScheduled) {
		obs.fit = r.Index.Fits(g)
	} else {
		obs.fit = inventory.FitResult{Verdict: inventory.FitsNow}
	}
	return obs, nil
}

// applyChildren makes the PodGroup, Service and pods what the decision says.
func (r *Reconciler) applyChildren(ctx context.Context, job *trainingv1alpha1.TrainingJob, obs observed, d *decision) error {
	key := client.ObjectKeyFromObject(job)
	if d.removePodGroup && obs.podGroup != nil {
		if err := r.Delete(ctx, obs.podGroup, client.Preconditions{UID: &obs.podGroup.UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting PodGroup: %w", err)
		}
	}
	if d.podGroup != nil && (obs.podGroup == nil || !gang.SpecMatches(obs.podGroup, d.podGroup)) {
		if _, err := apply.Apply(ctx, r.Client, d.podGroup, FieldOwner); err != nil {
			if meta.IsNoMatchError(err) {
				return fmt.Errorf("the PodGroup kind is not served yet: %w", err)
			}
			return fmt.Errorf("applying PodGroup: %w", err)
		}
	}
	if d.service {
		if err := r.ensureService(ctx, job); err != nil {
			return err
		}
	}
	if err := parallel(d.remove, func(p *corev1.Pod) error {
		if p.UID == "" {
			return nil // created but not in the cache yet; deleted once it is
		}
		err := r.Delete(ctx, p, client.Preconditions{UID: &p.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			r.exp.Deleted(key, p.UID, time.Now())
			return nil
		}
		return fmt.Errorf("deleting pod %s: %w", p.Name, err)
	}); err != nil {
		return err
	}
	return r.createPods(ctx, job, d.create)
}

// createPods creates pods in batches of 1, 2, 4, ... (as the Job controller
// does): a quota or admission error stops after a few failed calls instead of
// hundreds, and a healthy gang is created at the client's full rate.
func (r *Reconciler) createPods(ctx context.Context, job *trainingv1alpha1.TrainingJob, pods []*corev1.Pod) error {
	key := client.ObjectKeyFromObject(job)
	for batch := 1; len(pods) > 0; batch *= 2 {
		n := min(batch, len(pods))
		err := parallel(pods[:n], func(p *corev1.Pod) error {
			r.exp.Created(key, p, time.Now())
			if err := r.Create(ctx, p.DeepCopy()); err != nil {
				if apierrors.IsAlreadyExists(err) {
					return nil // created before a restart; the cache will show it
				}
				r.exp.CreateFailed(key, p.Name)
				return fmt.Errorf("creating pod %s: %w", p.Name, err)
			}
			return nil
		})
		if err != nil {
			r.Recorder.Eventf(job, nil, corev1.EventTypeWarning, "FailedCreatePod", "Create", "%v", err)
			return err
		}
		pods = pods[n:]
	}
	return nil
}

// parallel runs f on every pod, 64 calls in flight.
func parallel(pods []*corev1.Pod, f func(*corev1.Pod) error) error { return apply.Each(pods, 64, f) }

func (r *Reconciler) ensureService(ctx context.Context, job *trainingv1alpha1.TrainingJob) error {
	want := buildService(job, frameworks[job.Spec.Framework])
	have := &corev1.Service{}
	err := r.Get(ctx, client.ObjectKeyFromObject(want), have)
	if err == nil && metav1.IsControlledBy(have, job) && serviceMatches(have, want) {
		return nil
	}
	if apierrors.IsNotFound(err) {
		// The cache holds only Loom's Services: make sure the name is not
		// a user's Service before applying over it.
		err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(want), have)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err == nil && !metav1.IsControlledBy(have, job) {
		return fmt.Errorf("service %s exists and is not this job's: rename the job or the Service", want.Name)
	}
	if _, err := apply.Apply(ctx, r.Client, want, FieldOwner); err != nil {
		return fmt.Errorf("applying Service: %w", err)
	}
	return nil
}

func serviceMatches(have, want *corev1.Service) bool {
	if have.Spec.ClusterIP != corev1.ClusterIPNone || !have.Spec.PublishNotReadyAddresses ||
		!apiequality.Semantic.DeepEqual(have.Spec.Selector, want.Spec.Selector) || len(have.Spec.Ports) != len(want.Spec.Ports) {
		return false
	}
	for i := range want.Spec.Ports {
		h, w := have.Spec.Ports[i], want.Spec.Ports[i]
		if h.Name != w.Name || h.Port != w.Port || h.TargetPort != w.TargetPort {
			return false
		}
	}
	for k, v := range want.Labels {
		if have.Labels[k] != v {
			return false
		}
	}
	return true
}

// writeStatusCoalesced writes the status unless it changes only counts and
// messages and the last write was under coalesce.Interval ago; then it
// returns how long to wait.
func (r *Reconciler) writeStatusCoalesced(ctx context.Context, job *trainingv1alpha1.TrainingJob, st *trainingv1alpha1.TrainingJobStatus) (time.Duration, error) {
	if apiequality.Semantic.DeepEqual(&job.Status, st) {
		return 0, nil
	}
	if countsOnly(&job.Status, st) {
		if wait := r.writes.Wait(client.ObjectKeyFromObject(job)); wait > 0 {
			return wait, nil
		}
	}
	return 0, r.writeStatus(ctx, job, st)
}

// countsOnly: the new status differs from the old only in counts and
// condition messages (no state, condition status or reason changes).
func countsOnly(old, st *trainingv1alpha1.TrainingJobStatus) bool {
	return old.State == st.State && old.Attempt == st.Attempt && old.Restarts == st.Restarts &&
		old.ObservedGeneration == st.ObservedGeneration && coalesce.SameConditions(old.Conditions, st.Conditions)
}

func (r *Reconciler) writeStatus(ctx context.Context, job *trainingv1alpha1.TrainingJob, st *trainingv1alpha1.TrainingJobStatus) error {
	if apiequality.Semantic.DeepEqual(&job.Status, st) {
		return nil
	}
	if err := apply.Status(ctx, r.Client, job, st, FieldOwner); err != nil {
		return fmt.Errorf("writing TrainingJob status: %w", err)
	}
	job.Status = *st
	r.writes.Wrote(client.ObjectKeyFromObject(job))
	return nil
}

// sameAttempt: pod names repeat across attempts; only a pod of the attempt
// created satisfies the expectation.
func sameAttempt(cached, created *corev1.Pod) bool {
	return cached.Labels[LabelAttempt] == created.Labels[LabelAttempt]
}
