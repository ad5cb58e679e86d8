// Package raycluster reconciles standard ray.io/v1 RayClusters into what
// KubeRay would produce (its own exported builders make the pods, Services
// and autoscaler RBAC), with Loom's reconcile loop: expectations, template
// rollouts group by group, honest status, Volcano gangs through
// internal/gang and the GPU inventory.
//
// A pass observes the cluster's pods (cache plus expectations), head Service
// and PodGroup; decide (decide.go) turns that into the next status and the
// changes to make, in ordered pure phases; the children and the status are
// written through one apply.Writer, the pods created and deleted through one
// podset.Executor.
//
// Hostile or careless clusters get bounded work and a condition, never a
// panic: every count is computed in 64 bits (validate.go), a spec that
// KubeRay's validators or Loom's reject, or that asks for more pods than
// --max-workload-pods, is held with loom.dev/SpecValid False naming the
// field; one pass builds at most the pods one pass creates
// (podset.PerPass); a name taken by an object the cluster does not control
// is a NameConflict on ReplicaFailure, and the object is left alone: the
// head Service's, the headless worker Service's or a pod's holds the
// cluster up, an optional child's (the serve Service, the dashboard
// Ingress) only leaves that child out.
package raycluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/crdinstall"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/podset"
	"github.com/loom-dev/loom/internal/preflight"
)

// FieldOwner is the server-side-apply field manager of the RayCluster
// reconciler.
const FieldOwner = "loom-raycluster"

// +kubebuilder:rbac:groups=ray.io,resources=rayclusters,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=ray.io,resources=rayclusters/status,verbs=get;patch
// +kubebuilder:rbac:groups=ray.io,resources=rayclusters/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete;patch
// +kubebuilder:rbac:groups="",resources=pods/resize,verbs=patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=scheduling.volcano.sh,resources=podgroups,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=scheduling.volcano.sh,resources=queues,verbs=get;list;watch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch

// Reconciler reconciles RayClusters.
type Reconciler struct {
	client.Client
	APIReader        client.Reader
	Recorder         recorder.EventRecorder
	DefaultScheduler string
	Index            *inventory.Index
	// MaxWorkloadPods is the most pods one cluster may ask for (0: the
	// manager's default); a bigger one is held with a condition.
	MaxWorkloadPods int

	// writer writes the cluster's children and status; pods creates and
	// deletes its pods.
	writer  *apply.Writer
	pods    *podset.Executor
	volcano *gang.Volcano
}

// Setup registers the RayCluster reconciler with the manager.
func Setup(ctx context.Context, mgr ctrl.Manager, opts manager.Options) error {
	// The manager cannot start a watch on a kind that is not served: make
	// sure KubeRay's CRD is there first (the manager is not started yet, so
	// this reads and writes directly).
	present, err := crdinstall.Ensure(ctx, mgr.GetConfig(), mgr.GetClient(), mgr.GetAPIReader(), crd, opts.InstallRayCRD)
	if err != nil {
		return err
	}
	if !present {
		ctrl.Log.WithName("raycluster").Info("the RayCluster CRD (" + CRDName + ") is not installed and --install-ray-crd is off: the raycluster controller stays off; install KubeRay's CRD and restart the manager, or set rayCluster.installCRD")
		return nil
	}
	idx, err := inventory.Shared(ctx, mgr.GetCache(), opts.Namespace)
	if err != nil {
		return err
	}
	r := &Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		Recorder:         mgr.GetEventRecorder("loom-raycluster"),
		DefaultScheduler: opts.GangScheduler,
		Index:            idx,
		MaxWorkloadPods:  opts.MaxWorkloadPods,
	}
	// The cache holds only Loom's Services and Ingresses (the writer reads
	// around it before a create) and Roles and RoleBindings as metadata.
	r.writer = apply.NewWriter(r.Client, FieldOwner, apply.Options{Live: r.APIReader, Conditions: conditions,
		MetadataOnly: []schema.GroupKind{{Group: rbacv1.GroupName, Kind: "Role"}, {Group: rbacv1.GroupName, Kind: "RoleBinding"}},
		SpecOnly:     []schema.GroupKind{gang.PodGroupKind}})
	r.pods = podset.New(r.Client, r.APIReader, r.Recorder, nil)
	if err := r.pods.IndexCache(ctx, mgr.GetCache()); err != nil {
		return err
	}
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named("raycluster").
		// Labels name the gang's queue; annotations reach KubeRay's validator
		// and builders (ray.io/ft-enabled): an edit of either, which
		// leaves the generation as it was, is seen.
		For(&rayv1.RayCluster{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&corev1.Pod{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&networkingv1.Ingress{}).
		Owns(&rbacv1.Role{}, builder.OnlyMetadata).
		Owns(&rbacv1.RoleBinding{}, builder.OnlyMetadata).
		WatchesMetadata(&apiextensionsv1.CustomResourceDefinition{}, handler.EnqueueRequestsFromMapFunc(r.all), builder.WithPredicates(gang.IsCRD)).
		Build(r)
	if err != nil {
		return err
	}
	r.volcano = &gang.Volcano{Client: r.Client, Cache: mgr.GetCache(), Controller: c, Owner: &rayv1.RayCluster{}, Scheme: mgr.GetScheme(),
		QueueUsers: r.queueClusters}
	registerMetrics(mgr.GetCache())
	return nil
}

func (r *Reconciler) all(ctx context.Context, _ client.Object) []ctrl.Request {
	var list rayv1.RayClusterList
	if err := r.List(ctx, &list); err != nil {
		return nil
	}
	out := make([]ctrl.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// queueClusters lists the clusters that name a Volcano queue (their
// volcano.sh/queue-name label; none is Volcano's default queue), when it is
// created, opened or closed.
func (r *Reconciler) queueClusters(ctx context.Context, queue string) []ctrl.Request {
	var list rayv1.RayClusterList
	if err := r.List(ctx, &list); err != nil {
		return nil
	}
	var out []ctrl.Request
	for i := range list.Items {
		q := list.Items[i].Labels[LabelQueue]
		if q == queue || (q == "" && queue == gang.DefaultQueue) {
			out = append(out, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// scheduler is the cluster's gang scheduler: its ray.io/scheduler-name
// label, else the manager's (none for auto).
func scheduler(rc *rayv1.RayCluster, def string) string {
	if s := rc.Labels[LabelScheduler]; s != "" {
		return s
	}
	if def == manager.GangAuto {
		return "" // as KubeRay: a gang only when the cluster asks for one
	}
	return def
}

// Reconcile observes the cluster's pods, Services and PodGroup, decides,
// applies the decision, then writes the status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	orig := &rayv1.RayCluster{}
	if err := r.Get(ctx, req.NamespacedName, orig); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if orig.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	if orig.Spec.ManagedBy != nil && *orig.Spec.ManagedBy != "" && *orig.Spec.ManagedBy != utils.KubeRayController {
		return ctrl.Result{}, nil // another controller (e.g. MultiKueue) manages it
	}
	rc := normalized(orig)
	sched := scheduler(rc, r.DefaultScheduler)
	obs, err := r.observe(ctx, rc, sched, time.Now())
	if errors.Is(err, gang.ErrNotServedYet) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	d := decide(ctx, rc, obs, sched)
	if obs.refused = r.preflight(ctx, rc, d.preflight); obs.refused != "" {
		d = decide(ctx, rc, obs, sched)
	}
	return r.execute(ctx, orig, rc, obs, d)
}

// preflight asks the API server, with a dry run, whether it admits one
// pod of each group that lacks pods, and the head Service when it is not
// there, before any pod, Service or PodGroup is made: what it refuses as
// invalid, with the fields, "" when it refuses none (or cannot say). Of a
// head Service that is there, what it said to a write of it as it is now
// counts (no dry run: a create would meet the Service).
func (r *Reconciler) preflight(ctx context.Context, rc *rayv1.RayCluster, protos []prototype) string {
	var out []string
	refused := map[string][]string{}
	for _, p := range protos {
		why := ""
		if p.known {
			why = preflight.Known(rc.Name, p.path, p.obj)
		} else {
			why = preflight.Refused(ctx, r.Client, rc.Name, p.path, p.obj)
		}
		if why != "" {
			if refused[p.what] == nil {
				out = append(out, p.what)
			}
			refused[p.what] = append(refused[p.what], why)
		}
	}
	for i, what := range out {
		out[i] = "the API server refuses " + what + ": " + strings.Join(refused[what], "; ")
	}
	return strings.Join(out, "; ")
}

// execute carries out a decision: the events, the children and pods, then
// the status with what applying them said. orig is the cluster as read,
// rc its normalized copy. A status write that met a newer cluster (a
// guarded one: suspend, resume) is decided again shortly from a fresher
// copy; a name taken by an object the cluster does not control is reported
// on the status and looked at again later, neither logged as an error (an
// optional child's, d.skipped, holds nothing else up).
func (r *Reconciler) execute(ctx context.Context, orig, rc *rayv1.RayCluster, obs observed, d decision) (ctrl.Result, error) {
	r.record(orig, &d)
	res, applyErr := r.applyChildren(ctx, rc, obs, &d)
	res.Deferred += int(clamp32(d.deferred))
	if apply.IsForeign(applyErr) {
		r.conflictEvent(orig, applyErr)
	} else if applyErr == nil && d.skipped != nil {
		r.conflictEvent(orig, d.skipped)
	}
	applied(&d.status, applyErr, d.skipped, rc.Generation, obs.now)
	was := orig.Status.DeepCopy()
	wait, err := r.writeStatus(ctx, orig, &d.status, obs.now, d.guard)
	if err == nil && wait == 0 {
		observeProvisioned(orig, was, &d.status, obs.now)
	}
	switch {
	case apierrors.IsConflict(err):
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	case err == nil && nameConflict(applyErr):
		// Not Again for deferred pods: the pass would meet the same name.
		return ctrl.Result{RequeueAfter: podset.Result{}.RequeueAfter(wait, conflictRecheck)}, nil
	}
	if err := errors.Join(applyErr, err); err != nil {
		return ctrl.Result{}, err
	}
	if d.skipped != nil {
		// The object in the way is not the cluster's: no watch event says
		// it is gone.
		return ctrl.Result{RequeueAfter: res.RequeueAfter(wait, conflictRecheck)}, nil
	}
	return ctrl.Result{RequeueAfter: res.RequeueAfter(wait)}, nil
}

const (
	// conflictRetry is how soon a pass whose guarded status write met a
	// newer cluster runs again (the cache catches up within milliseconds).
	conflictRetry = 250 * time.Millisecond
	// conflictRecheck is how often a name conflict is looked at again: the
	// object in the way is not the cluster's, so no watch event says it
	// is gone.
	conflictRecheck = 30 * time.Second
)

// conflictEvent records a Warning when a child's name conflict is new (the
// pod executor records its own for pods).
func (r *Reconciler) conflictEvent(rc *rayv1.RayCluster, err error) {
	c := meta.FindStatusCondition(rc.Status.Conditions, string(rayv1.RayClusterReplicaFailure))
	if c != nil && c.Status == metav1.ConditionTrue && c.Reason == ReasonNameConflict && c.Message == podset.Message(err) {
		return
	}
	r.Recorder.Eventf(rc, nil, corev1.EventTypeWarning, ReasonNameConflict, "Apply", "%s", apply.Truncate(err.Error(), podset.MaxNote))
}

// record records the decision's events.
func (r *Reconciler) record(rc *rayv1.RayCluster, d *decision) {
	for _, e := range d.events {
		kind := corev1.EventTypeNormal
		if e.warning {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(rc, nil, kind, e.reason, "Reconcile", "%s", e.msg)
	}
}

// forget drops what the writer and the pod executor remember of a cluster
// that is gone.
func (r *Reconciler) forget(key client.ObjectKey) {
	gone := &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}
	r.pods.Forget(gone)
	r.writer.Forget(gone)
	forgetMetrics(key)
}

func (r *Reconciler) observe(ctx context.Context, rc *rayv1.RayCluster, sched string, now time.Time) (observed, error) {
	obs := observed{now: now, fits: map[string]inventory.FitResult{}, maxPods: r.MaxWorkloadPods, autoGang: r.DefaultScheduler == manager.GangAuto}
	var err error
	if obs.pods, err = r.pods.List(ctx, rc, client.MatchingLabels{utils.RayClusterLabelKey: rc.Name}, now); err != nil {
		return obs, err
	}
	if obs.headService, obs.oldHeads, err = r.headServices(ctx, rc); err != nil {
		return obs, err
	}
	obs.podGroup, obs.volcano, err = r.volcano.Group(ctx, rc, podGroupName(rc))
	if err != nil && sched != gang.SchedulerName {
		// Only a PodGroup left from when the cluster asked for Volcano
		// is looked for: none is as good.
		obs.podGroup, obs.volcano, err = nil, false, nil
	}
	if err != nil {
		return obs, err
	}
	if sched == gang.SchedulerName && obs.volcano {
		if obs.queue, err = r.volcano.Queue(ctx, rc.Labels[LabelQueue]); err != nil {
			return obs, err
		}
	}
	fit := func(group string, spec *corev1.PodSpec) {
		if groups := inventory.PodGroups(1, spec); len(groups) > 0 {
			obs.fits[group] = r.Index.Fits(inventory.Gang{Groups: groups})
		}
	}
	fit(headGroup, &rc.Spec.HeadGroupSpec.Template.Spec)
	for i := range rc.Spec.WorkerGroupSpecs {
		fit(rc.Spec.WorkerGroupSpecs[i].GroupName, &rc.Spec.WorkerGroupSpecs[i].Template.Spec)
	}
	return obs, nil
}

// headServices reads the cluster's head Service from the cache (nil when
// absent) and the head Services of other names it controls, left from
// before spec.headGroupSpec.headService renamed it.
func (r *Reconciler) headServices(ctx context.Context, rc *rayv1.RayCluster) (*corev1.Service, []*corev1.Service, error) {
	name, err := utils.GenerateHeadServiceName(utils.RayClusterCRD, rc.Spec, rc.Name)
	if err != nil {
		return nil, nil, err
	}
	var list corev1.ServiceList
	if err := r.List(ctx, &list, client.InNamespace(rc.Namespace),
		client.MatchingLabels{utils.RayClusterLabelKey: rc.Name, utils.RayNodeTypeLabelKey: string(rayv1.HeadNode)}); err != nil {
		return nil, nil, err
	}
	var old []*corev1.Service
	for i := range list.Items {
		if svc := &list.Items[i]; svc.Name != name && metav1.IsControlledBy(svc, rc) {
			old = append(old, svc)
		}
	}
	svc := &corev1.Service{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: name}, svc); err != nil {
		return nil, old, client.IgnoreNotFound(err)
	}
	return svc, old, nil
}

// applyChildren makes the PodGroup, the Services, the autoscaler's RBAC and
// the pods what the decision says, through the writer and the pod
// executor.
func (r *Reconciler) applyChildren(ctx context.Context, rc *rayv1.RayCluster, obs observed, d *decision) (podset.Result, error) {
	if d.err != nil {
		return podset.Result{}, d.err
	}
	if d.removePodGroup && obs.podGroup != nil {
		if err := r.writer.Delete(ctx, obs.podGroup, "no longer desired"); err != nil {
			return podset.Result{}, err
		}
	}
	var skipped []error
	for i, c := range d.children {
		if err := r.writer.Ensure(ctx, rc, c); err != nil {
			if i > 0 && apply.IsForeign(err) && c.GetName() != rc.Name+"-"+utils.HeadlessServiceSuffix {
				// An optional child (the serve Service, the dashboard
				// Ingress): someone else's object of its name is left
				// alone (KubeRay would use it as its own), and the cluster
				// runs without it. Not the headless worker Service: a
				// multi-host group's hosts find each other through it.
				skipped = append(skipped, fmt.Errorf("%w: the cluster runs without it; rename the RayCluster or that %s", err, c.GetObjectKind().GroupVersionKind().Kind))
				continue
			}
			if i == 0 {
				// The head Service, built from what the user wrote: a
				// refusal as invalid (what a dry run does not check: a
				// nodePort outside the server's range; an update) holds
				// the cluster from the next pass, as the preflight's.
				for _, p := range d.preflight {
					if p.what == headServiceWhat {
						preflight.Record(rc.Name, p.obj, err)
					}
				}
			}
			if apply.IsForeign(err) {
				err = fmt.Errorf("%w: rename the RayCluster (or its headService) or the %s", err, c.GetObjectKind().GroupVersionKind().Kind)
			}
			return podset.Result{}, err
		}
	}
	d.skipped = joined(skipped)
	if err := r.removeUnwanted(ctx, rc, d.unwanted); err != nil {
		return podset.Result{}, err
	}
	for _, c := range d.shared {
		// As KubeRay: someone else's is never taken over (its garbage
		// collection would follow the cluster's).
		if err := r.writer.Ensure(ctx, rc, c); err != nil && !apply.IsForeign(err) {
			return podset.Result{}, err
		}
	}
	if d.podGroup != nil {
		if err := r.writer.Ensure(ctx, rc, d.podGroup); err != nil {
			return podset.Result{}, err
		}
	}
	return r.pods.Sync(ctx, rc, d.remove, d.create)
}

// joined is errs as one error wrapping each, "; " between their messages
// (errors.Join's newlines do not fit a condition); nil for none.
func joined(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	args := make([]any, len(errs))
	for i, err := range errs {
		args[i] = err
	}
	return fmt.Errorf(strings.TrimSuffix(strings.Repeat("%w; ", len(errs)), "; "), args...)
}

// removeUnwanted deletes the children the cluster no longer wants (the
// annotation or the field that asked for them turned off) that are in the
// cache, carry Loom's label and are controlled by the cluster: an object
// of the name a person (or KubeRay) made is left alone, and nothing is
// written when none is there.
func (r *Reconciler) removeUnwanted(ctx context.Context, rc *rayv1.RayCluster, unwanted []client.Object) error {
	for _, o := range unwanted {
		if err := r.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		if !metav1.IsControlledBy(o, rc) || o.GetLabels()[apply.LabelManagedBy] != apply.ManagedBy || o.GetDeletionTimestamp() != nil {
			continue
		}
		if err := r.writer.Delete(ctx, o, "turned off"); err != nil {
			return err
		}
	}
	return nil
}

// writeStatus writes the cluster's status through the writer, with a new
// lastUpdateTime when it changed; a change of counts and messages only
// waits for the coalescing interval (the returned duration). guard sends
// the resourceVersion the status was computed from: a status that
// suspends or resumes must not land on a newer spec.
func (r *Reconciler) writeStatus(ctx context.Context, rc *rayv1.RayCluster, st *rayv1.RayClusterStatus, now time.Time, guard bool) (time.Duration, error) {
	touched(&rc.Status, st, now)
	opts := []apply.StatusOption{apply.CountsOnly(countsOnly(&rc.Status, st)), apply.Progress(progressOnly(&rc.Status, st))}
	if guard {
		opts = append(opts, apply.Guarded())
	}
	wait, err := r.writer.Status(ctx, rc, &rc.Status, st, opts...)
	if err == nil && wait == 0 {
		rc.Status = *st.DeepCopy()
	}
	return wait, err
}
