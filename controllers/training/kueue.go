package training

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/kueue"
	"github.com/loom-dev/loom/internal/optional"
)

// TrainingJobs are a Kueue external framework (Kueue's
// integrations.externalFrameworks: TrainingJob.v1alpha1.training.loom.dev):
// Loom, not Kueue, creates each queued job's Workload and starts and stops
// the gang on Kueue's word.
//
// A job carrying kueue.x-k8s.io/queue-name is held like a suspended one
// (no pods, state Suspended, the Suspended condition saying it waits for
// Kueue) until its Workload is admitted, without Loom writing the job's
// spec: Loom has no admission webhook to default runPolicy.suspend at
// creation, and a controller that set it on first sight would race the
// job's first pass. The admitted flavours' node labels and tolerations are
// added to the pods Loom builds, outside spec.replicaSpecs. An eviction
// (preemption, a stopped queue) holds the whole gang again: its pods are
// deleted, and once none is left the Workload's quota is released so that
// Kueue can admit it again; the next admission starts a new attempt. A
// queued job its user suspends deactivates its Workload (Kueue's way to
// stop a queued job: Kueue evicts it, and the quota is released), which
// its resumption reactivates; a Workload deactivated by anyone else holds
// the job until it is reactivated by hand.
//
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=workloads,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=workloads/status,verbs=get;patch
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=resourceflavors;workloadpriorityclasses;localqueues,verbs=get;list;watch
// +kubebuilder:rbac:groups=training.loom.dev,resources=trainingjobs,verbs=patch
// +kubebuilder:rbac:groups=scheduling.k8s.io,resources=priorityclasses,verbs=get;list;watch

var trainingJobGVK = trainingv1alpha1.GroupVersion.WithKind("TrainingJob")

// kueueObs is what a pass knows of a queued job's Workload.
type kueueObs struct {
	// queued: the job names a LocalQueue.
	queued bool
	// unnamed: the job names none, and the manager runs no job outside
	// Kueue (--kueue-manage-jobs-without-queue-name): it is held.
	unnamed bool
	// annotationOnly: the job names a LocalQueue in the annotation
	// kueue.x-k8s.io/queue-name, not the label, which Kueue no longer
	// reads: it is not queued, and its status says so.
	annotationOnly bool
	// served: Kueue's Workload CRD is installed and served.
	served bool
	wl     *kueue.Workload
	// placement per role, from the admitted flavours.
	placement map[trainingv1alpha1.Role]kueue.Placement
	// priority is the Workload's priority class and value, read only
	// when the Workload is to be created (see priority).
	priority *kueuePriority
	// missingClass names the priority class the job asks for that does
	// not exist: no Workload is made until it does (as Kueue's jobs).
	missingClass string
	// badQueue says why no LocalQueue can have the name the queue label
	// gives (Kueue's webhook refuses such a label on its own jobs, and its
	// Workload CRD such a spec.queueName): the job gets no Workload.
	badQueue string
	// stale: the Workload no longer asks for the job's pod sets (their
	// counts or requests were edited while the job was suspended), or its
	// admission covers part of them (Uncovered), so its admission does not
	// cover the gang the job would run now.
	stale bool
	// cannotRun says why the job as written can never run (cannotRun):
	// it gets no Workload, and one it has goes once no pod of it is
	// left, so that it takes no quota from jobs that can run (Kueue's
	// jobframework makes no Workload for a job that fails validation).
	cannotRun string
}

// holds: the gang may not run now (not admitted, evicted, admitted for
// pod sets the job no longer has, or its Workload is being deleted).
func (k *kueueObs) holds() bool {
	return k.unnamed || k.queued && (!k.wl.Admitted() || k.wl.Evicted() != nil || !k.wl.Active() || k.stale || k.deleting())
}

// suspendedByLoom: the Workload was deactivated by Loom for its job's
// runPolicy.suspend (AnnotationWorkloadSuspended), to be reactivated when
// the job resumes.
func (k *kueueObs) suspendedByLoom() bool {
	return !k.wl.Active() && k.wl.Annotations[trainingv1alpha1.AnnotationWorkloadSuspended] != ""
}

// deleting: the job's Workload is being deleted (another party's finalizer
// keeps it): as jobframework, the job stops, whatever its admission says.
func (k *kueueObs) deleting() bool {
	return k.wl != nil && k.wl.DeletionTimestamp != nil
}

// kueueJobs reads Workloads and ResourceFlavors for the reconciler.
type kueueJobs struct {
	cache  client.Reader
	live   client.Reader
	kind   *optional.Kind
	client client.Client
	// classes is Kueue's WorkloadPriorityClass kind, read through the
	// cache and watched once served, as PriorityClasses are from the
	// start: a job held on a class that does not exist is woken when it
	// is created, not polled for it. nil in the tests that read classes
	// from a fake client.
	classes *optional.Kind
	// queues is Kueue's LocalQueue kind, read (metadata only) through the
	// cache for a namespace's default LocalQueue.
	queues *optional.Kind
	// labelKeys are the keys of the job labels copied to a new Workload
	// (--kueue-label-keys-to-copy, Kueue's labelKeysToCopy).
	labelKeys []string
	// manageUnnamed holds the jobs that name no LocalQueue
	// (--kueue-manage-jobs-without-queue-name, Kueue's
	// manageJobsWithoutQueueName).
	manageUnnamed bool
}

// jobLister lists the jobs keep selects (Reconciler.jobsWhere).
type jobLister func(ctx context.Context, keep func(*trainingv1alpha1.TrainingJob) bool) []ctrl.Request

func newKueueJobs(c client.Client, live client.Reader, ca cache.Cache, ctl controller.Controller, scheme *runtime.Scheme, labelKeys []string, jobs jobLister) (*kueueJobs, error) {
	k := &kueueJobs{cache: ca, live: live, client: c, labelKeys: labelKeys}
	k.kind = &optional.Kind{CRD: kueue.WorkloadCRD, GVK: kueue.WorkloadGVK, Watch: func() error {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(kueue.WorkloadGVK)
		return ctl.Watch(source.Kind[client.Object](ca, u,
			handler.EnqueueRequestForOwner(scheme, c.RESTMapper(), &trainingv1alpha1.TrainingJob{}, handler.OnlyControllerOwner())))
	}}
	k.classes = &optional.Kind{CRD: kueue.WorkloadPriorityClassCRD, GVK: kueue.WorkloadPriorityClassGVK, Watch: func() error {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(kueue.WorkloadPriorityClassGVK)
		return ctl.Watch(source.Kind[client.Object](ca, u, heldOn(jobs, kueue.WorkloadPriorityClassGVK.Kind), created))
	}}
	k.queues = &optional.Kind{CRD: kueue.LocalQueueCRD, GVK: kueue.LocalQueueGVK}
	return k, ctl.Watch(source.Kind[client.Object](ca, &schedulingv1.PriorityClass{}, heldOn(jobs, "PriorityClass"), created))
}

// defaultQueue labels a job that names no LocalQueue
// kueue.x-k8s.io/queue-name: default when its namespace has a LocalQueue
// named default, as Kueue's webhook labels its own jobs at their creation
// (LocalQueueDefaulting, locked on since Kueue v0.17), so that a namespace
// whose jobs all go through Kueue is not bypassed by one that forgot the
// label. Loom has no webhook: it does so at the job's first pass (no
// status yet), before anything of the job is made; a job created before
// the LocalQueue, or whose label is removed later, is not labelled, as in
// Kueue. It reports whether it labelled the job, whose label edit wakes it
// again, queued.
func (k *kueueJobs) defaultQueue(ctx context.Context, job *trainingv1alpha1.TrainingJob) (bool, error) {
	if k == nil || job.Status.State != "" || job.Labels[kueue.QueueLabel] != "" {
		return false, nil
	}
	if served, err := k.queues.Served(ctx, k.client); err != nil || !served {
		return false, err
	}
	lq := &metav1.PartialObjectMetadata{}
	lq.SetGroupVersionKind(kueue.LocalQueueGVK)
	if err := k.cache.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: kueue.DefaultLocalQueue}, lq); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	patch := fmt.Sprintf(`{"metadata":{"resourceVersion":%q,"labels":{%q:%q}}}`, job.ResourceVersion, kueue.QueueLabel, kueue.DefaultLocalQueue)
	log.FromContext(ctx).V(1).Info("patch", "kind", "TrainingJob", "object", client.ObjectKeyFromObject(job), "fieldOwner", FieldOwner,
		"why", "the job names no LocalQueue and its namespace has a LocalQueue named default (Kueue's LocalQueueDefaulting)")
	if err := k.client.Patch(ctx, job, client.RawPatch(types.MergePatchType, []byte(patch)), client.FieldOwner(FieldOwner)); err != nil {
		return false, fmt.Errorf("labelling the job with its namespace's default LocalQueue: %w", err)
	}
	return true, nil
}

// created passes creations only: a class's creation is what a job held
// on it waits for.
var created = predicate.Funcs{
	CreateFunc:  func(ctrlevent.CreateEvent) bool { return true },
	UpdateFunc:  func(ctrlevent.UpdateEvent) bool { return false },
	DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return false },
	GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
}

// heldOn wakes the unfinished queued jobs whose priority names the class
// of that kind just created: one held without a Workload for it gets its
// Workload now.
func heldOn(jobs jobLister, kind string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []ctrl.Request {
		class := kind + " " + o.GetName()
		return jobs(ctx, func(j *trainingv1alpha1.TrainingJob) bool {
			return j.Labels[kueue.QueueLabel] != "" && !j.Status.Finished() && priorityClassOf(j) == class
		})
	})
}

// observe fills obs.kueue for a job that names a LocalQueue.
// With the integration off (--kueue=false, k nil) the queue label means
// nothing to Loom: the job runs as any other.
func (k *kueueJobs) observe(ctx context.Context, job *trainingv1alpha1.TrainingJob, obs *observed) error {
	obs.kueue = kueueObs{}
	if k == nil {
		return nil
	}
	obs.kueue.queued = job.Labels[kueue.QueueLabel] != ""
	obs.kueue.annotationOnly = !obs.kueue.queued && job.Annotations[kueue.QueueLabel] != ""
	if !obs.kueue.queued {
		obs.kueue.unnamed = k.manageUnnamed && !job.Status.Finished()
		// The label removed: a Workload left from when the job was queued
		// is found, so that it goes (it queues, or holds quota, for a job
		// that no longer asks Kueue).
		if !k.kind.Watching() {
			return nil
		}
		obs.kueue.served = true
		return k.workload(ctx, job, obs)
	}
	served, err := k.kind.Served(ctx, k.client)
	if err != nil || !served {
		return err
	}
	obs.kueue.served = true
	if err := k.workload(ctx, job, obs); err != nil {
		return err
	}
	if errs := validation.IsDNS1123Subdomain(job.Labels[kueue.QueueLabel]); len(errs) > 0 {
		obs.kueue.badQueue = strings.Join(errs, "; ")
	}
	obs.kueue.cannotRun = cannotRun(job, obs)
	if obs.kueue.cannotRun == "" && obs.kueue.badQueue == "" && readPriority(obs.kueue.wl, job) {
		if obs.kueue.priority, obs.kueue.missingClass, err = k.priority(ctx, job); err != nil {
			return err
		}
	}
	if wl := obs.kueue.wl; wl != nil && !wl.Finished() {
		obs.kueue.stale = !wl.SamePodSets(podSets(job)) || wl.Uncovered() != ""
	}
	if !obs.kueue.wl.Admitted() {
		return nil
	}
	return k.placements(ctx, obs.kueue.wl, obs)
}

// workload reads the job's Workload from the cache into obs, if there is
// one.
func (k *kueueJobs) workload(ctx context.Context, job *trainingv1alpha1.TrainingJob, obs *observed) error {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kueue.WorkloadGVK)
	key := types.NamespacedName{Namespace: job.Namespace, Name: kueue.WorkloadName(job.Name, job.UID, trainingJobGVK)}
	if err := k.cache.Get(ctx, key, u); err != nil {
		return client.IgnoreNotFound(err)
	}
	wl := &kueue.Workload{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, wl); err != nil {
		return fmt.Errorf("reading Workload %s: %w", key, err)
	}
	obs.kueue.wl = wl
	return nil
}

// kueuePriority is a Workload's spec.priorityClassRef and spec.priority.
type kueuePriority struct {
	ref   kueue.PriorityClassRef
	value int32
}

// priority is the Workload's priority as jobframework's ExtractPriority
// finds it for Kueue's own jobs: the kueue.x-k8s.io/priority-class
// label's WorkloadPriorityClass; else the pods' PriorityClass (the first
// role's template's, else spec.gang.priorityClassName, which Loom gives
// the pods); else the cluster's globalDefault PriorityClass. Kueue orders
// its queues and chooses whom to preempt by it. A class named that does
// not exist is returned as missing: Kueue makes no Workload for its own
// jobs then (a Workload at priority 0 would queue behind, and be preempted
// by, everything, and keep that priority once the class appears). Classes
// are read through the cache, whose watch wakes the jobs held on one when
// it is created (heldOn).
func (k *kueueJobs) priority(ctx context.Context, job *trainingv1alpha1.TrainingJob) (_ *kueuePriority, missing string, _ error) {
	class := priorityClassOf(job)
	if name := job.Labels[kueue.PriorityClassLabel]; name != "" {
		if !nameable(name) {
			return nil, class, nil
		}
		if k.classes != nil {
			// Not served: none exists. Once the CRD is, its watch wakes
			// the held jobs (Setup's CRD watch).
			served, err := k.classes.Served(ctx, k.client)
			if errors.Is(err, optional.ErrNotServedYet) || (err == nil && !served) {
				return nil, class, nil
			}
			if err != nil {
				return nil, "", err
			}
		}
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(kueue.WorkloadPriorityClassGVK)
		if err := k.cache.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				return nil, class, nil
			}
			return nil, "", err
		}
		v, ok, _ := unstructured.NestedInt64(u.Object, "value")
		if !ok {
			return nil, "", nil
		}
		return &kueuePriority{ref: kueue.PriorityClassRef{Group: kueue.Group, Kind: "WorkloadPriorityClass", Name: name}, value: int32(v)}, "", nil
	}
	if name := podPriorityClass(job); name != "" {
		if !nameable(name) {
			return nil, class, nil
		}
		pc := &schedulingv1.PriorityClass{}
		if err := k.cache.Get(ctx, client.ObjectKey{Name: name}, pc); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, class, nil
			}
			return nil, "", err
		}
		return podPriority(pc), "", nil
	}
	var list schedulingv1.PriorityClassList
	if err := k.cache.List(ctx, &list); err != nil {
		return nil, "", err
	}
	// As Kueue: of several global defaults, the lowest.
	var def *schedulingv1.PriorityClass
	for i := range list.Items {
		if pc := &list.Items[i]; pc.GlobalDefault && (def == nil || pc.Value < def.Value) {
			def = pc
		}
	}
	if def == nil {
		return nil, "", nil
	}
	return podPriority(def), "", nil
}

// priorityClassOf is the class the job's priority is read from, as
// "WorkloadPriorityClass <name>" or "PriorityClass <name>": its
// kueue.x-k8s.io/priority-class label's, else its pods'; "" when it names
// none (the cluster's default then).
func priorityClassOf(job *trainingv1alpha1.TrainingJob) string {
	if name := job.Labels[kueue.PriorityClassLabel]; name != "" {
		return kueue.WorkloadPriorityClassGVK.Kind + " " + name
	}
	if name := podPriorityClass(job); name != "" {
		return "PriorityClass " + name
	}
	return ""
}

// nameable: some object can have the name. One that none can (a pod
// template's priorityClassName "a/b", which the CRD does not check) does
// not exist, and is not asked for: the client refuses to build its path,
// an error on every pass instead of a job held saying so.
func nameable(name string) bool { return len(validation.IsDNS1123Subdomain(name)) == 0 }

func podPriority(pc *schedulingv1.PriorityClass) *kueuePriority {
	return &kueuePriority{ref: kueue.PriorityClassRef{Group: schedulingv1.GroupName, Kind: "PriorityClass", Name: pc.Name}, value: pc.Value}
}

// podPriorityClass is the PriorityClass the job's pods run with: the
// first role's template's, else the gang's.
func podPriorityClass(job *trainingv1alpha1.TrainingJob) string {
	for _, ps := range podSets(job) {
		if n := ps.Template.Spec.PriorityClassName; n != "" {
			return n
		}
	}
	return job.Spec.Gang.PriorityClassName
}

// releaseGone deletes the Workloads of a job that is gone or going, as
// Kueue's own job integrations do when their job is deleted: the quota
// comes back at once, not when the garbage collector reaches the Workload
// (which on a busy control plane, or just after Kueue's CRDs appeared, can
// take minutes). Only Workloads whose controller is a TrainingJob of that
// name are touched; with the integration off or Kueue absent it does nothing.
func (k *kueueJobs) releaseGone(ctx context.Context, key client.ObjectKey, w *apply.Writer) error {
	if k == nil || !k.kind.Watching() {
		return nil
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(kueue.WorkloadGVK.GroupVersion().WithKind(kueue.WorkloadGVK.Kind + "List"))
	if err := k.cache.List(ctx, list, client.InNamespace(key.Namespace)); err != nil {
		return err
	}
	for i := range list.Items {
		wl := &list.Items[i]
		owner := metav1.GetControllerOf(wl)
		if owner == nil || owner.Kind != trainingJobGVK.Kind || owner.Name != key.Name || !strings.HasPrefix(owner.APIVersion, trainingJobGVK.Group+"/") {
			continue
		}
		if wl.GetDeletionTimestamp() == nil {
			if err := w.Delete(ctx, wl, "its TrainingJob is gone: release the quota now"); err != nil {
				return err
			}
			continue
		}
		if fin := wl.GetFinalizers(); slices.Contains(fin, kueue.ResourceInUseFinalizer) {
			// As jobframework with a deleted job's Workloads.
			rest := slices.DeleteFunc(slices.Clone(fin), func(f string) bool { return f == kueue.ResourceInUseFinalizer })
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": rest, "resourceVersion": wl.GetResourceVersion()}})
			log.FromContext(ctx).V(1).Info("patch", "kind", "Workload", "object", client.ObjectKeyFromObject(wl), "fieldOwner", FieldOwner,
				"why", "its TrainingJob is gone: drop the resource-in-use finalizer")
			if err := k.client.Patch(ctx, wl, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldOwner)); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}

// placements reads the admitted flavours and turns them into each role's
// node selector and tolerations, with what the admission checks add.
func (k *kueueJobs) placements(ctx context.Context, wl *kueue.Workload, obs *observed) error {
	flavors := map[string]*kueue.ResourceFlavor{}
	obs.kueue.placement = map[trainingv1alpha1.Role]kueue.Placement{}
	for _, role := range roles {
		names := wl.Flavors(string(role))
		for _, n := range names {
			if _, ok := flavors[n]; ok {
				continue
			}
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(kueue.ResourceFlavorGVK)
			if err := k.live.Get(ctx, client.ObjectKey{Name: n}, u); err != nil {
				return fmt.Errorf("reading ResourceFlavor %s of Workload %s: %w", n, wl.Name, err)
			}
			f := &kueue.ResourceFlavor{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, f); err != nil {
				return err
			}
			flavors[n] = f
		}
		pl := kueue.PlacementOf(names, flavors)
		// As jobframework labels the pods of Kueue's own jobs (Kueue's
		// TAS and tooling find a pod's pod set by it).
		pl.Labels = map[string]string{kueue.PodSetLabel: string(role)}
		pl.AddUpdates(wl, string(role))
		obs.kueue.placement[role] = pl
	}
	return nil
}

// desiredWorkload is the job's Workload as jobframework's NewWorkload
// builds one: pod sets master and worker (a role without replicas is left
// out) with their pod templates, the queue, the maximum execution time of
// the kueue.x-k8s.io/max-exec-time-seconds label, the ProvisioningRequest
// annotations (provreq.kueue.x-k8s.io/*), the priority class, and the job's
// labels of the keys given (Kueue's labelKeysToCopy: copied when the
// Workload is created, not followed after).
func desiredWorkload(job *trainingv1alpha1.TrainingJob, priority *kueuePriority, labelKeys []string) *unstructured.Unstructured {
	wl := &kueue.Workload{Spec: kueue.WorkloadSpec{QueueName: job.Labels[kueue.QueueLabel], PodSets: podSets(job),
		MaximumExecutionTimeSeconds: kueue.MaxExecTime(job.Labels)}}
	wl.APIVersion, wl.Kind = kueue.WorkloadGVK.GroupVersion().String(), kueue.WorkloadGVK.Kind
	wl.Name = kueue.WorkloadName(job.Name, job.UID, trainingJobGVK)
	wl.Namespace = job.Namespace
	wl.Labels = map[string]string{}
	for _, k := range labelKeys {
		if v, ok := job.Labels[k]; ok {
			wl.Labels[k] = v
		}
	}
	wl.Labels[kueue.JobUIDLabel] = string(job.UID)
	wl.Finalizers = []string{kueue.ResourceInUseFinalizer}
	wl.Annotations = kueue.ProvReqAnnotations(job.Annotations)
	if job.Spec.RunPolicy.Suspend {
		// A job suspended at creation is not queued, and takes no quota,
		// until it resumes.
		inactive := false
		wl.Spec.Active = &inactive
		if wl.Annotations == nil {
			wl.Annotations = map[string]string{}
		}
		wl.Annotations[trainingv1alpha1.AnnotationWorkloadSuspended] = "true"
	}
	if priority != nil {
		wl.Spec.PriorityClassRef = &priority.ref
		wl.Spec.Priority = &priority.value
	}
	obj, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(wl)
	u := &unstructured.Unstructured{Object: obj}
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return u
}

func podSets(job *trainingv1alpha1.TrainingJob) []kueue.PodSet {
	var out []kueue.PodSet
	for _, role := range roles {
		n := replicas(job, role)
		rs := replicaSpec(job, role)
		if rs == nil || n == 0 {
			continue
		}
		t := rs.Template.DeepCopy()
		t.Spec.RestartPolicy = corev1.RestartPolicyNever
		out = append(out, kueue.PodSet{Name: string(role), Count: n, Template: *t})
	}
	return out
}

// kueueQueueLabel names a job's LocalQueue.
const kueueQueueLabel = kueue.QueueLabel

// queueAnnotationIgnored says, for a job that names its LocalQueue in the
// kueue.x-k8s.io/queue-name annotation alone, that Kueue does not queue
// it: Kueue reads the label of that name only (v0.15 removed the
// annotation, deprecated since v0.3, from jobframework), and so does Loom,
// as for Kueue's own jobs. "" for any other job.
func queueAnnotationIgnored(p *pass) string {
	if !p.obs.kueue.annotationOnly {
		return ""
	}
	return "the job names LocalQueue " + p.job.Annotations[kueueQueueLabel] + " in the annotation " + kueueQueueLabel +
		", which Kueue no longer reads (it reads the label of that name only): Kueue does not queue this job; set the label instead"
}

// queueMovePending says, for a job whose queue label names another
// LocalQueue than the one its Workload holds quota through, that the move
// waits: a Workload holding quota keeps its queue (Kueue refuses a queue
// change of its own running jobs; Loom has no webhook to refuse it), and
// the gang runs on; once the quota is released (an eviction, the gang
// gone), the Workload is replaced in the new queue. "" for any other job.
func queueMovePending(p *pass) string {
	k := &p.obs.kueue
	to := p.job.Labels[kueueQueueLabel]
	if !k.queued || k.wl == nil || k.deleting() || k.wl.Finished() || !k.wl.QuotaReserved() || k.wl.Spec.QueueName == to {
		return ""
	}
	return "the job's " + kueueQueueLabel + " label names LocalQueue " + to + ", but its Kueue Workload " + k.wl.Name +
		" holds quota through LocalQueue " + k.wl.Spec.QueueName + ": the move to " + to +
		" is pending until that quota is released (Kueue evicts the job), the gang running on until then"
}

// evictedBy is Kueue's eviction reason and message for a deactivated
// Workload ("; Kueue: DeactivatedDueToRequeuingLimitExceeded: The workload
// is deactivated due to exceeding the maximum number of re-queuing
// retries"), or "" before Kueue evicted it.
func evictedBy(wl *kueue.Workload) string {
	if c := wl.Evicted(); c != nil {
		return "; Kueue: " + c.Reason + ": " + c.Message
	}
	return ""
}
