// Package rayjob reconciles standard ray.io/v1 RayJobs the way KubeRay's
// RayJob controller does: a RayCluster from rayClusterSpec (owned, named
// <rayjob>-<5 random characters>) or an existing one by clusterSelector,
// the Ray job submitted by a submitter Job (K8sJobMode), by Loom through
// the dashboard's Jobs API (HTTPMode) or by the user (InteractiveMode), its
// status followed on the dashboard, retries on a new cluster
// (backoffLimit), suspension, deadlines and clean-up after the job.
//
// Loom's raycluster controller runs the clusters it creates; this package
// never builds pods. A pass observes the RayJob, its cluster, submitter Job
// and the dashboard; decide (decide.go, running.go, finished.go) is the
// pure state machine; the children are written through one apply.Writer,
// then the status. The job id and the cluster name are in the status before
// anything is created or submitted, so a restart submits exactly once.
// Before submitting, the RayJob reads its cluster's own verdict from the
// conditions Loom's raycluster controller writes (it can never fit, its
// gang is held, it is stalled) and says so in its status (verdict.go).
// KubeRay's RayJob metrics and Loom's time to running are on the
// manager's registry (metrics.go).
package rayjob

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/crdinstall"
	"github.com/loom-dev/loom/internal/manager"
)

// FieldOwner is the server-side-apply field manager of the RayJob
// reconciler.
const FieldOwner = "loom-rayjob"

// EnvDashboardOverride, set in the manager's environment, sends every
// dashboard request to this address instead of the cluster's head Service.
// It is for tests (a simulated cluster's head pod runs no dashboard), never
// for production.
const EnvDashboardOverride = "LOOM_RAY_DASHBOARD_URL_OVERRIDE"

// +kubebuilder:rbac:groups=ray.io,resources=rayjobs,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=ray.io,resources=rayjobs/status,verbs=get;patch
// +kubebuilder:rbac:groups=ray.io,resources=rayjobs/finalizers,verbs=update
// +kubebuilder:rbac:groups=ray.io,resources=rayclusters,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch

func init() {
	// Loom runs deletionStrategy: KubeRay's validation asks for its gate.
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{"RayJobDeletionPolicy": true}); err != nil {
		panic(err)
	}
}

// Reconciler reconciles RayJobs.
type Reconciler struct {
	client.Client
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	// DashboardFor is the dashboard client for a cluster's dashboard
	// address (status.dashboardURL).
	DashboardFor func(address string) Dashboard
	// DeleteAfterShutdown: shutdownAfterJobFinishes deletes the RayJob
	// itself, its cluster and submitter going with it, rather than the
	// cluster alone (KubeRay's DELETE_RAYJOB_CR_AFTER_JOB_FINISHES).
	DeleteAfterShutdown bool

	writer *apply.Writer
	mu     sync.Mutex
	// unreachable counts each RayJob's failed dashboard requests in a row.
	unreachable map[types.NamespacedName]dashFailures
	// stops counts each RayJob's failed stops of its given-up Ray job.
	stops map[types.NamespacedName]stopAttempts
}

type dashFailures struct {
	n     int
	since time.Time
}

// Setup registers the RayJob reconciler with the manager.
func Setup(ctx context.Context, mgr ctrl.Manager, opts manager.Options) error {
	log := ctrl.Log.WithName("rayjob")
	present, err := crdinstall.Ensure(ctx, mgr.GetConfig(), mgr.GetClient(), mgr.GetAPIReader(), crd, opts.InstallRayCRD)
	if err != nil {
		return err
	}
	rcCRD := &apiextensionsv1.CustomResourceDefinition{}
	if err := mgr.GetAPIReader().Get(ctx, client.ObjectKey{Name: "rayclusters.ray.io"}, rcCRD); client.IgnoreNotFound(err) != nil {
		return err
	} else if err != nil || !present {
		log.Info("the RayJob or RayCluster CRD is not installed and --install-ray-crd is off: the rayjob controller stays off; install KubeRay's CRDs and restart the manager, or set rayCluster.installCRD")
		return nil
	}
	override := os.Getenv(EnvDashboardOverride)
	if override != "" {
		log.Info("every Ray dashboard request goes to "+override+" ("+EnvDashboardOverride+", for tests only)", "address", override)
	}
	// Read as KubeRay's operator reads it, so that a manager given
	// KubeRay's environment runs RayJobs as KubeRay did.
	deleteAfter := strings.EqualFold(os.Getenv(utils.DELETE_RAYJOB_CR_AFTER_JOB_FINISHES), "true")
	if deleteAfter {
		log.Info(utils.DELETE_RAYJOB_CR_AFTER_JOB_FINISHES + " is true: shutdownAfterJobFinishes deletes the RayJob itself after ttlSecondsAfterFinished, its RayCluster and submitter Job with it")
	}
	r := &Reconciler{
		Client:              mgr.GetClient(),
		APIReader:           mgr.GetAPIReader(),
		Recorder:            mgr.GetEventRecorder("loom-rayjob"),
		DeleteAfterShutdown: deleteAfter,
		DashboardFor: func(address string) Dashboard {
			if override != "" {
				address = override
			}
			return NewHTTPDashboard(address, DashboardTimeout)
		},
	}
	r.writer = apply.NewWriter(r.Client, FieldOwner, apply.Options{Live: r.APIReader})
	registerMetrics(mgr.GetCache())
	return ctrl.NewControllerManagedBy(mgr).
		Named("rayjob").
		For(&rayv1.RayJob{}).
		Owns(&rayv1.RayCluster{}).
		Owns(&batchv1.Job{}).
		Owns(&corev1.Service{}).
		Complete(r)
}

// Reconcile observes the RayJob, its cluster, submitter and dashboard,
// decides, writes the children, then the status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	job := &rayv1.RayJob{}
	if err := r.Get(ctx, req.NamespacedName, job); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if utils.ManagedByExternalController(job.Spec.ManagedBy) != nil {
		return ctrl.Result{}, nil // another controller (MultiKueue) runs it
	}
	if job.DeletionTimestamp != nil {
		return ctrl.Result{}, r.finalize(ctx, job)
	}
	if err := r.addFinalizer(ctx, job); err != nil {
		return ctrl.Result{}, err
	}
	obs, err := r.observe(ctx, job, time.Now())
	if apply.IsForeign(err) {
		return r.writeFailed(ctx, job, err, "")
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	d := decide(obs)
	// The cluster the attempt runs on is recorded before anything is
	// submitted to it (the submitter Job, an HTTPMode submission).
	if err := r.bindCluster(ctx, job, d.bindCluster); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		return r.writeFailed(ctx, job, err, "")
	}
	// A child written since the cache read it refuses the write (409
	// Conflict): no trouble of the RayJob's. The status says what the pass
	// decided, not the conflict, and the pass runs again shortly from a
	// fresher copy; every step the pass left undone is decided again then
	// (decide derives them from the status and the children).
	err = r.write(ctx, obs, &d)
	conflict := apierrors.IsConflict(err)
	if err != nil && !conflict {
		return r.writeFailed(ctx, job, err, d.serviceConflict)
	}
	if !rayv1.IsJobDeploymentTerminal(d.status.JobDeploymentStatus) {
		d.status.Message = withConflict(d.status.Message, d.serviceConflict)
	}
	// Guarded: the status carries the names of the cluster and the Ray job
	// of this attempt, drawn once; a pass on a cache copy older than the
	// last write must fail (and run again on a fresh one) rather than draw
	// new names over them, which would leave a cluster nothing owns an
	// attempt for.
	if _, err := r.writer.Status(ctx, job, &job.Status, &d.status, apply.Guarded()); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		return ctrl.Result{}, err
	}
	observeStatus(job, &job.Status, &d.status, time.Now())
	if conflict && (d.requeue == 0 || d.requeue > conflictRetry) {
		d.requeue = conflictRetry
	}
	return ctrl.Result{RequeueAfter: d.requeue}, nil
}

// conflictRetry is how soon a pass whose write met a newer object (the
// RayJob's status, a child) runs again.
const conflictRetry = 250 * time.Millisecond

// conflictRecheck is how often a name conflict is looked at again: the
// object in the way is not the RayJob's, so no watch event says it is gone.
const conflictRecheck = 30 * time.Second

// writeFailed reports a step of the pass that failed (a child's write or
// delete, an HTTPMode submission) on the RayJob: a Warning event (KubeRay's
// reason for the step) and, while the RayJob has not finished, the status
// as it was with a message saying what failed. No state or name of this
// pass is recorded, as its steps were not all done; observedGeneration is,
// since the spec was read. A finished RayJob keeps its message (the Ray
// job's result); the message keeps the RayJob-level Service's name
// conflict this pass found (conflict), so it is not warned of again. A
// child's name taken by an object the RayJob does not control (the
// submitter Job's, the cluster's), which Loom leaves alone, is looked at
// again later; any other failure is returned, so the pass is tried again
// with backoff.
func (r *Reconciler) writeFailed(ctx context.Context, job *rayv1.RayJob, err error, conflict string) (ctrl.Result, error) {
	reason, msg, res, ret := "", err.Error(), ctrl.Result{}, err
	var se *stepError
	if errors.As(err, &se) {
		reason = se.reason
	}
	if reason == "" {
		reason = "FailedToReconcile"
	}
	if apply.IsForeign(err) {
		reason, msg = ReasonNameConflict, msg+": rename the RayJob or delete that object"
		res, ret = ctrl.Result{RequeueAfter: conflictRecheck}, nil
	}
	r.event(job, corev1.EventTypeWarning, reason, "%s", msg)
	st := job.Status.DeepCopy()
	st.ObservedGeneration = job.Generation
	if !rayv1.IsJobDeploymentTerminal(job.Status.JobDeploymentStatus) {
		st.Message = withConflict(msg, conflict)
	}
	if _, err := r.writer.Status(ctx, job, &job.Status, st, apply.Guarded()); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		return ctrl.Result{}, errors.Join(ret, err)
	}
	return res, ret
}

// bindCluster records uid ("": nothing to record) as the UID of the
// cluster the RayJob's attempt runs on (AnnotationClusterUID). The RayJob
// takes the new resourceVersion, so that its guarded status write follows.
func (r *Reconciler) bindCluster(ctx context.Context, job *rayv1.RayJob, uid string) error {
	if uid == "" {
		return nil
	}
	patch := client.MergeFromWithOptions(job.DeepCopy(), client.MergeFromWithOptimisticLock{})
	metav1.SetMetaDataAnnotation(&job.ObjectMeta, AnnotationClusterUID, uid)
	return r.writer.Patch(ctx, job, patch, "record the RayCluster the attempt runs on")
}

// forget drops what the reconciler keeps of a RayJob that is gone or
// going: its dashboard failures, its metrics' series and what the writer
// remembers of its children.
func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	delete(r.unreachable, key)
	delete(r.stops, key)
	r.mu.Unlock()
	forgetMetrics(key)
	if r.writer != nil {
		r.writer.Forget(&rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}})
	}
}
