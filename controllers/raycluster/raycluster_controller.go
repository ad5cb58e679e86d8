// Package raycluster reconciles standard ray.io/v1 RayClusters into what
// KubeRay would produce (its own exported builders make the pods and
// Services), with Loom's reconcile loop: expectations, template rollouts,
// honest status, Volcano gangs through internal/gang and the GPU inventory.
package raycluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/common"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/coalesce"
	"github.com/loom-dev/loom/internal/expect"
	"github.com/loom-dev/loom/internal/gang"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
)

// FieldOwner is the server-side-apply field manager of the RayCluster
// reconciler.
const FieldOwner = "loom-raycluster"

// +kubebuilder:rbac:groups=ray.io,resources=rayclusters,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=ray.io,resources=rayclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=ray.io,resources=rayclusters/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete;patch
// +kubebuilder:rbac:groups="",resources=pods/resize,verbs=patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=scheduling.volcano.sh,resources=podgroups,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch

// Reconciler reconciles RayClusters.
type Reconciler struct {
	client.Client
	APIReader        client.Reader
	Recorder         recorder.EventRecorder
	DefaultScheduler string
	Index            *inventory.Index

	exp     *expect.Pods
	volcano *gang.Volcano

	writes coalesce.Writes
}

// Setup registers the RayCluster reconciler with the manager.
func Setup(ctx context.Context, mgr ctrl.Manager, opts manager.Options) error {
	// The manager cannot start a watch on a kind that is not served: make
	// sure KubeRay's CRD is there first (the manager is not started yet, so
	// this reads and writes directly).
	present, err := EnsureCRD(ctx, mgr.GetClient(), mgr.GetAPIReader(), opts.InstallRayCRD)
	if err != nil {
		return err
	}
	if !present {
		ctrl.Log.WithName("raycluster").Info("the RayCluster CRD (" + CRDName + ") is not installed and --install-ray-crd is off: the raycluster controller stays off; install KubeRay's CRD and restart the manager, or set rayCluster.installCRD")
		return nil
	}
	idx, err := inventory.Shared(ctx, mgr.GetCache())
	if err != nil {
		return err
	}
	r := &Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		Recorder:         mgr.GetEventRecorder("loom-raycluster"),
		DefaultScheduler: opts.GangScheduler,
		Index:            idx,
		exp:              expect.New(),
	}
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named("raycluster").
		For(&rayv1.RayCluster{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		Owns(&corev1.Pod{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.Role{}, builder.OnlyMetadata).
		Owns(&rbacv1.RoleBinding{}, builder.OnlyMetadata).
		WatchesMetadata(&apiextensionsv1.CustomResourceDefinition{}, handler.EnqueueRequestsFromMapFunc(r.all), builder.WithPredicates(gang.IsCRD)).
		Build(r)
	if err != nil {
		return err
	}
	r.volcano = &gang.Volcano{Client: r.Client, Cache: mgr.GetCache(), Controller: c, Owner: &rayv1.RayCluster{}, Scheme: mgr.GetScheme()}
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

// scheduler is the cluster's gang scheduler: its ray.io/scheduler-name
// label, else the manager's default.
func (r *Reconciler) scheduler(rc *rayv1.RayCluster) string {
	if s := rc.Labels[LabelScheduler]; s != "" {
		return s
	}
	return r.DefaultScheduler
}

// Reconcile observes the cluster's pods, Services and PodGroup, decides and
// applies the decision, then writes the status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	orig := &rayv1.RayCluster{}
	if err := r.Get(ctx, req.NamespacedName, orig); err != nil {
		if apierrors.IsNotFound(err) {
			r.exp.Forget(req.NamespacedName)
			r.writes.Forget(req.NamespacedName)
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
	now := time.Now()
	sched := r.scheduler(rc)
	obs, err := r.observe(ctx, rc, sched, now)
	if errors.Is(err, gang.ErrNotServedYet) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	d := decide(ctx, rc, obs, sched)
	for _, e := range d.events {
		kind := corev1.EventTypeNormal
		if e.warning {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(orig, nil, kind, e.reason, "Reconcile", "%s", e.msg)
	}

	applyErr := r.applyChildren(ctx, rc, obs, &d)
	if applyErr != nil {
		msg := applyErr.Error()
		if len(msg) > 1000 {
			msg = msg[:1000] + "…"
		}
		setCond(&d.status, string(rayv1.RayClusterReplicaFailure), metav1.ConditionTrue, "FailedToApply", msg, rc.Generation, now)
	} else if c := meta.FindStatusCondition(d.status.Conditions, string(rayv1.RayClusterReplicaFailure)); c != nil && c.Status == metav1.ConditionTrue {
		setCond(&d.status, string(rayv1.RayClusterReplicaFailure), metav1.ConditionFalse, "Applied", "every pod and Service was created or deleted as needed", rc.Generation, now)
	}
	wait, err := r.writeStatus(ctx, orig, &d.status)
	if err := errors.Join(applyErr, err); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: wait}, nil
}

func (r *Reconciler) observe(ctx context.Context, rc *rayv1.RayCluster, sched string, now time.Time) (observed, error) {
	obs := observed{now: now, fits: map[string]inventory.FitResult{}}
	obs.invalid = utils.ValidateRayClusterSpec(&rc.Spec, rc.Annotations)
	if obs.invalid == nil {
		obs.invalid = validateGroupNames(rc)
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(rc.Namespace), client.MatchingLabels{utils.RayClusterLabelKey: rc.Name}); err != nil {
		return obs, err
	}
	cached := make([]*corev1.Pod, 0, len(pods.Items))
	for i := range pods.Items {
		if metav1.IsControlledBy(&pods.Items[i], rc) {
			cached = append(cached, &pods.Items[i])
		}
	}
	obs.pods = r.exp.Overlay(client.ObjectKeyFromObject(rc), cached, now, nil)

	svc := &corev1.Service{}
	name, err := utils.GenerateHeadServiceName(utils.RayClusterCRD, rc.Spec, rc.Name)
	if err != nil {
		return obs, err
	}
	switch err := r.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: name}, svc); {
	case err == nil:
		obs.headService = svc
	case !apierrors.IsNotFound(err):
		return obs, err
	}
	if sched == "volcano" {
		if obs.volcano, err = r.volcano.Installed(ctx); err != nil {
			return obs, err
		}
	}
	if obs.volcano {
		pg := &schedulingv1beta1.PodGroup{}
		switch err := r.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: podGroupName(rc)}, pg); {
		case err == nil:
			if metav1.IsControlledBy(pg, rc) {
				obs.podGroup = pg
			}
		case !apierrors.IsNotFound(err):
			return obs, err
		}
	} else if sched != "volcano" {
		// A PodGroup left from when the cluster asked for Volcano.
		pg := &schedulingv1beta1.PodGroup{}
		if installed, _ := r.volcano.Installed(ctx); installed {
			if err := r.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: podGroupName(rc)}, pg); err == nil && metav1.IsControlledBy(pg, rc) {
				obs.podGroup = pg
			}
		}
	}
	fit := func(group string, spec *corev1.PodSpec) {
		if gpus := inventory.PodGPUs(spec); gpus > 0 {
			obs.fits[group] = r.Index.Fits(inventory.Gang{Groups: []inventory.PodGroup{{Count: 1, GPUs: gpus}}, Product: spec.NodeSelector[inventory.ProductLabel]})
		}
	}
	fit(headGroup, &rc.Spec.HeadGroupSpec.Template.Spec)
	for i := range rc.Spec.WorkerGroupSpecs {
		fit(rc.Spec.WorkerGroupSpecs[i].GroupName, &rc.Spec.WorkerGroupSpecs[i].Template.Spec)
	}
	return obs, nil
}

// validateGroupNames rejects what KubeRay's validation lets through but
// would make two groups claim the same pods: duplicate group names, or a
// worker group named like the head's.
func validateGroupNames(rc *rayv1.RayCluster) error {
	seen := map[string]bool{headGroup: true}
	for _, g := range rc.Spec.WorkerGroupSpecs {
		if seen[g.GroupName] {
			if g.GroupName == headGroup {
				return fmt.Errorf("worker group name %q is reserved for the head group", g.GroupName)
			}
			return fmt.Errorf("worker group name %q is used twice: each group needs its own name", g.GroupName)
		}
		seen[g.GroupName] = true
	}
	return nil
}

// applyChildren writes what the decision asks for: Services and autoscaler
// RBAC when missing or changed, the PodGroup, then pod deletions and
// creations.
func (r *Reconciler) applyChildren(ctx context.Context, rc *rayv1.RayCluster, obs observed, d *decision) error {
	key := client.ObjectKeyFromObject(rc)
	if d.removePodGroup && obs.podGroup != nil {
		if err := r.Delete(ctx, obs.podGroup); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting PodGroup: %w", err)
		}
	}
	if d.children {
		if err := r.ensureServices(ctx, rc, obs); err != nil {
			return err
		}
		if utils.IsAutoscalingEnabled(&rc.Spec) {
			if err := r.ensureAutoscalerRBAC(ctx, rc); err != nil {
				return err
			}
		}
	}
	if d.gang {
		want := gang.PodGroup(gangSpec(ctx, rc))
		if obs.podGroup == nil || !gang.SpecMatches(obs.podGroup, want) {
			if _, err := apply.Apply(ctx, r.Client, want, FieldOwner); err != nil {
				return fmt.Errorf("applying PodGroup: %w", err)
			}
		}
	}
	errs := []error{apply.Each(d.remove, 64, func(p *corev1.Pod) error {
		if p.UID == "" {
			return nil // created but not in the cache yet; deleted once it is
		}
		err := r.Delete(ctx, p, client.Preconditions{UID: &p.UID})
		if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			r.exp.Deleted(key, p.UID, time.Now())
			return nil
		}
		return fmt.Errorf("deleting pod %s: %w", p.Name, err)
	})}
	// Slow start, as the Job controller: 1, 2, 4, ... so that a quota or
	// admission error costs a few calls, not one per pod.
	for batch, pods := 1, d.create; len(pods) > 0; batch *= 2 {
		n := min(batch, len(pods))
		err := apply.Each(pods[:n], 64, func(p *corev1.Pod) error {
			if err := r.Create(ctx, p); err != nil {
				return fmt.Errorf("creating a pod of group %s: %w", groupOf(p), err)
			}
			r.exp.Created(key, p, time.Now())
			return nil
		})
		if err != nil {
			errs = append(errs, err)
			break
		}
		pods = pods[n:]
	}
	return errors.Join(errs...)
}

func (r *Reconciler) ensureServices(ctx context.Context, rc *rayv1.RayCluster, obs observed) error {
	want, err := buildHeadService(ctx, rc)
	if err != nil {
		return err
	}
	if obs.headService == nil || !serviceMatches(obs.headService, want) {
		if err := r.applyService(ctx, rc, want); err != nil {
			return err
		}
	}
	multiHost := false
	for _, g := range rc.Spec.WorkerGroupSpecs {
		multiHost = multiHost || g.NumOfHosts > 1
	}
	if !multiHost {
		return nil
	}
	hl := buildHeadlessWorkerService(rc)
	have := &corev1.Service{}
	if err := r.Get(ctx, client.ObjectKeyFromObject(hl), have); err == nil && serviceMatches(have, hl) {
		return nil
	}
	return r.applyService(ctx, rc, hl)
}

func (r *Reconciler) applyService(ctx context.Context, rc *rayv1.RayCluster, want *corev1.Service) error {
	have := &corev1.Service{}
	// The cache holds only Loom's Services: never apply over a user's.
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(want), have); err == nil && !metav1.IsControlledBy(have, rc) {
		return fmt.Errorf("service %s exists and does not belong to RayCluster %s", want.Name, rc.Name)
	}
	if _, err := apply.Apply(ctx, r.Client, want, FieldOwner); err != nil {
		return fmt.Errorf("applying Service %s: %w", want.Name, err)
	}
	return nil
}

// ensureAutoscalerRBAC creates the autoscaler's ServiceAccount, Role and
// RoleBinding as KubeRay does, when missing (the SA only when the head
// template names none).
func (r *Reconciler) ensureAutoscalerRBAC(ctx context.Context, rc *rayv1.RayCluster) error {
	var objs []client.Object
	if rc.Spec.HeadGroupSpec.Template.Spec.ServiceAccountName == "" {
		sa, err := common.BuildServiceAccount(rc)
		if err != nil {
			return err
		}
		sa.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}
		objs = append(objs, sa)
	}
	role, err := common.BuildRole(rc)
	if err != nil {
		return err
	}
	role.TypeMeta = metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"}
	rb, err := common.BuildRoleBinding(rc)
	if err != nil {
		return err
	}
	rb.TypeMeta = metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"}
	objs = append(objs, role, rb)
	for _, o := range objs {
		have := &metav1.PartialObjectMetadata{}
		have.SetGroupVersionKind(o.GetObjectKind().GroupVersionKind())
		switch err := r.Get(ctx, client.ObjectKeyFromObject(o), have); {
		case err == nil && metav1.IsControlledBy(have, rc):
			continue
		case err == nil:
			// Someone else's (as KubeRay, never take it over: its
			// garbage collection would follow the cluster's).
			continue
		case !apierrors.IsNotFound(err):
			return err
		}
		o.SetOwnerReferences([]metav1.OwnerReference{ownerRef(rc)})
		if _, err := apply.Apply(ctx, r.Client, o.(runtime.Object), FieldOwner); err != nil {
			return fmt.Errorf("applying autoscaler %s %s: %w", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
	}
	return nil
}

func serviceMatches(have, want *corev1.Service) bool {
	if want.Spec.ClusterIP != "" && have.Spec.ClusterIP != want.Spec.ClusterIP {
		return false
	}
	if !apiequality.Semantic.DeepEqual(have.Spec.Selector, want.Spec.Selector) || len(have.Spec.Ports) != len(want.Spec.Ports) || !metav1.IsControlledBy(have, &metav1.ObjectMeta{UID: want.OwnerReferences[0].UID}) {
		return false
	}
	// As a set: KubeRay builds a custom head Service's ports from a map, in
	// no fixed order.
	ports := map[string]int32{}
	for _, p := range have.Spec.Ports {
		ports[p.Name] = p.Port
	}
	for _, p := range want.Spec.Ports {
		if got, ok := ports[p.Name]; !ok || got != p.Port {
			return false
		}
	}
	return true
}

// writeStatus writes the status when it changed; changes of counts and
// messages only are written at most every coalesce.Interval.
func (r *Reconciler) writeStatus(ctx context.Context, rc *rayv1.RayCluster, st *rayv1.RayClusterStatus) (time.Duration, error) {
	if apiequality.Semantic.DeepEqual(&rc.Status, st) {
		return 0, nil
	}
	key := client.ObjectKeyFromObject(rc)
	if countsOnly(&rc.Status, st) {
		if wait := r.writes.Wait(key); wait > 0 {
			return wait, nil
		}
	}
	t := metav1.Now()
	st.LastUpdateTime = &t
	if err := apply.Status(ctx, r.Client, rc, st, FieldOwner); err != nil {
		return 0, fmt.Errorf("writing RayCluster status: %w", err)
	}
	rc.Status = *st
	r.writes.Wrote(key)
	return 0, nil
}

// countsOnly: the new status differs from the old only in counts and
// condition messages.
func countsOnly(old, st *rayv1.RayClusterStatus) bool {
	return old.State == st.State && old.ObservedGeneration == st.ObservedGeneration && old.Head == st.Head &&
		coalesce.SameConditions(old.Conditions, st.Conditions)
}
