package rayjob

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/podset"
	"github.com/loom-dev/loom/internal/preflight"
)

// normalized is the RayJob with the defaults its CRD would give (a RayJob
// created before the CRD's defaults, or by a client that skips them).
func normalized(j *rayv1.RayJob) *rayv1.RayJob {
	out := j.DeepCopy()
	if out.Spec.SubmissionMode == "" {
		out.Spec.SubmissionMode = rayv1.K8sJobMode
	}
	return out
}

// observe reads what one pass needs, from the cache and, while the Ray job
// runs, from its dashboard.
func (r *Reconciler) observe(ctx context.Context, job *rayv1.RayJob, now time.Time) (observed, error) {
	j := normalized(job)
	o := observed{job: j, now: now, newJobID: utils.GenerateRayJobId(j.Name), newCluster: utils.GenerateRayClusterName(j.Name), invalid: validate(j),
		deleteAfterShutdown: r.DeleteAfterShutdown}
	if o.invalid == nil {
		o.invalid = r.preflightCluster(ctx, j)
	}
	if o.invalid == nil {
		o.invalid = r.preflightSubmitter(ctx, j)
	}
	if o.invalid != nil && validatedIn(j.Status.JobDeploymentStatus) {
		return o, nil // ValidationFailed: a started or finished RayJob is still followed (decide)
	}
	st := j.Status
	if st.RayClusterName != "" {
		rc := &rayv1.RayCluster{}
		err := r.Get(ctx, types.NamespacedName{Namespace: j.Namespace, Name: st.RayClusterName}, rc)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return o, err
		case !selectorMode(j) && !metav1.IsControlledBy(rc, job):
			return o, &apply.ForeignError{Kind: "RayCluster", Key: client.ObjectKeyFromObject(rc).String(), Reason: "is not controlled by RayJob " + j.Name}
		case replaced(j, rc):
			o.replacedBy = string(rc.UID)
		default:
			o.cluster = rc
		}
	}
	if o.cluster != nil && st.DashboardURL == "" && o.cluster.Status.State == rayv1.Ready {
		o.headURL = r.headURL(ctx, o.cluster)
	}
	if j.Spec.SubmissionMode == rayv1.K8sJobMode {
		sj := &batchv1.Job{}
		err := r.Get(ctx, types.NamespacedName{Namespace: j.Namespace, Name: j.Name}, sj)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return o, err
		case metav1.IsControlledBy(sj, job):
			o.submitter = sj
		}
	}
	if st.JobDeploymentStatus == rayv1.JobDeploymentStatusRunning && st.DashboardURL != "" && st.JobId != "" && o.cluster != nil {
		o.dash = r.askDashboard(ctx, client.ObjectKeyFromObject(j), st, now)
	}
	if st.JobDeploymentStatus == rayv1.JobDeploymentStatusWaiting && st.DashboardURL != "" && j.Spec.JobId != "" && o.cluster != nil && !j.Spec.Suspend {
		ask := st
		ask.JobId = j.Spec.JobId // is the user's job on this attempt's cluster?
		o.dash = r.askDashboard(ctx, client.ObjectKeyFromObject(j), ask, now)
	}
	if o.dash.notFound && o.submitter != nil {
		if at, _ := submitterFinished(o.submitter); at == nil {
			trouble, err := r.submitterTrouble(ctx, o.submitter)
			if err != nil {
				return o, err
			}
			o.submitterTrouble = trouble
		}
	}
	return o, nil
}

// replaced reports whether rc, of the name in the RayJob's status, is not
// the cluster its attempt runs on (AnnotationClusterUID) but one created
// since under that name. An attempt that has not submitted yet
// (Initializing) takes the cluster there is; one submitted or finished is
// bound to its own.
func replaced(j *rayv1.RayJob, rc *rayv1.RayCluster) bool {
	uid := j.Annotations[AnnotationClusterUID]
	switch j.Status.JobDeploymentStatus {
	case rayv1.JobDeploymentStatusWaiting, rayv1.JobDeploymentStatusRunning, rayv1.JobDeploymentStatusComplete, rayv1.JobDeploymentStatusFailed:
		return uid != "" && uid != string(rc.UID)
	}
	return false
}

// preflightSubmitter asks the API server, with dry runs, whether it admits
// the submitter Job Loom makes (K8sJobMode) and a pod of the user's
// submitter template (spec.submitterPodTemplate, with what Loom adds to
// it), before the Job is made: while the RayJob has not started (so
// before its cluster is made) or comes up. The Job is refused for what a
// pod is not (a template label the Job sets itself: job-name,
// controller-uid; an admission policy on Jobs), and a pod for what its Job
// is not (an admission policy on pods): a Job whose pods the API server
// refuses is made all the same, and its pods never are. A refusal as
// invalid is the RayJob's spec error, naming the fields
// (internal/preflight), those of the Job as the RayJob's fields they come
// from. The pod of KubeRay's default template (the head's image) is not
// asked about; in clusterSelector mode, without a template, neither is
// its Job, whose image is the selected cluster's.
func (r *Reconciler) preflightSubmitter(ctx context.Context, j *rayv1.RayJob) error {
	switch j.Status.JobDeploymentStatus {
	case rayv1.JobDeploymentStatusNew, rayv1.JobDeploymentStatusValidationFailed, rayv1.JobDeploymentStatusSuspended, rayv1.JobDeploymentStatusInitializing:
	default:
		return nil
	}
	if j.Spec.SubmissionMode != rayv1.K8sJobMode {
		return nil
	}
	rc := &rayv1.RayCluster{}
	if j.Spec.RayClusterSpec != nil && !selectorMode(j) {
		rc.Spec = *j.Spec.RayClusterSpec
	}
	// The job id and dashboard of any attempt: the shape, and so the
	// answer kept for it, is the same for every RayJob of this spec.
	st := rayv1.RayJobStatus{JobId: j.Name, DashboardURL: j.Name + "-head-svc:8265"}
	sj, err := desiredSubmitter(j, st, rc)
	if err != nil {
		return nil // said when the submitter is made
	}
	if j.Spec.SubmitterPodTemplate != nil {
		// As the Job controller makes it: controlled by the Job (whose UID
		// no dry run can know), without blockOwnerDeletion, which the Job
		// controller sets, not Loom.
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: sj.Name, Namespace: sj.Namespace, Labels: sj.Spec.Template.Labels, Annotations: sj.Spec.Template.Annotations,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: sj.Name, UID: unknownUID, Controller: ptr.To(true)}}},
			Spec: sj.Spec.Template.Spec,
		}
		if why := preflight.Refused(ctx, r.Client, j.Name, "spec.submitterPodTemplate", pod); why != "" {
			return fmt.Errorf("the API server refuses the submitter pod: %s", why)
		}
	}
	// The dry run's Job has a generated name: the job-name labels the API
	// server would set itself to the Job's name are not the template's
	// error.
	for _, k := range []string{batchv1.JobNameLabel, "job-name"} {
		if sj.Spec.Template.Labels[k] == sj.Name {
			delete(sj.Spec.Template.Labels, k)
		}
	}
	// The Job as the writer makes it: controlled by the RayJob, Loom's.
	sj.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(j, rayv1.GroupVersion.WithKind("RayJob"))}
	sj.Labels[apply.LabelManagedBy] = apply.ManagedBy
	if why := preflight.Refused(ctx, r.Client, j.Name, "", sj); why != "" {
		return fmt.Errorf("the API server refuses the submitter Job: %s", jobFields.ReplaceAllStringFunc(why, rayJobField))
	}
	return nil
}

// preflightCluster asks the API server, with a dry run, whether it admits
// the RayCluster the RayJob would create (its rayClusterSpec, labels and
// annotations), while nothing of the RayJob runs (New, ValidationFailed,
// Suspended): the RayCluster CRD's validation and an admission policy on
// RayClusters refuse what the RayJob's may not. A refusal as invalid is
// the RayJob's spec error, the cluster's fields named as the RayJob's
// (spec.rayClusterSpec), instead of a RayJob started whose cluster's
// create fails on every pass.
func (r *Reconciler) preflightCluster(ctx context.Context, j *rayv1.RayJob) error {
	if !validatedIn(j.Status.JobDeploymentStatus) || selectorMode(j) || j.Spec.RayClusterSpec == nil {
		return nil
	}
	// As the writer makes it, under a name of its own (the RayJob's and
	// five characters, as an attempt's).
	rc := desiredCluster(j, "")
	rc.GenerateName = j.Name + "-"
	rc.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(j, rayv1.GroupVersion.WithKind("RayJob"))}
	rc.Labels[apply.LabelManagedBy] = apply.ManagedBy
	if why := preflight.Refused(ctx, r.Client, j.Name, "", rc); why != "" {
		return fmt.Errorf("the API server refuses the RayCluster: %s", clusterFields.ReplaceAllString(why, "${1}spec.rayClusterSpec."))
	}
	return nil
}

// unknownUID stands for the UID of an owner a dry run cannot know.
const unknownUID types.UID = "00000000-0000-0000-0000-000000000000"

// clusterFields finds the RayCluster's spec fields, the RayJob's
// rayClusterSpec, in the API server's causes.
var clusterFields = regexp.MustCompile(`(^|; )spec\.`)

// jobFields finds the submitter Job's fields that come from the RayJob's
// in the API server's causes ("<field>: <message>", joined by "; ").
var jobFields = regexp.MustCompile(`(^|; )(spec\.template|spec\.backoffLimit)\b`)

// rayJobField is the RayJob's field a submitter Job's field comes from.
func rayJobField(s string) string {
	s = strings.Replace(s, "spec.template", "spec.submitterPodTemplate", 1)
	return strings.Replace(s, "spec.backoffLimit", "spec.submitterConfig.backoffLimit", 1)
}

// submitterTrouble is why a pod of the submitter Job, which has not
// submitted the Ray job yet, does not run (not placed, an image that
// cannot be pulled, a crash loop), "" when none says. It reads the pod
// cache, and only while the RayJob waits for the submission. The pods are
// found by the Job's own selector (its controller-uid label, which the
// API server sets), so those of a submitter made by an earlier Loom,
// without the RayJob's origin labels, are found too.
func (r *Reconciler) submitterTrouble(ctx context.Context, sj *batchv1.Job) (string, error) {
	if sj.Spec.Selector == nil {
		return "", nil // never so for a Job the API server admitted
	}
	sel, err := metav1.LabelSelectorAsSelector(sj.Spec.Selector)
	if err != nil {
		return "", err
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(sj.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return "", err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if !metav1.IsControlledBy(p, sj) || p.DeletionTimestamp != nil {
			continue
		}
		if why := podset.WaitingWhy(p); why != "" {
			return "pod " + p.Name + " " + why, nil
		}
	}
	return "", nil
}

// headURL is the dashboard address of a ready cluster's head Service, ""
// while there is none. The cache holds only the Services Loom labels: the
// head Service of a cluster another operator runs (a KubeRay operator
// running RayClusters, a cluster picked by clusterSelector) is read from
// the API server, once per pass until the address is in the status.
func (r *Reconciler) headURL(ctx context.Context, rc *rayv1.RayCluster) string {
	u, err := utils.FetchHeadServiceURL(ctx, r.Client, rc, utils.DashboardPortName)
	if apierrors.IsNotFound(err) && r.APIReader != nil {
		u, err = utils.FetchHeadServiceURL(ctx, liveReads{Client: r.Client, live: r.APIReader}, rc, utils.DashboardPortName)
	}
	if err != nil {
		return ""
	}
	return u
}

// liveReads is a client whose Get reads from the API server.
type liveReads struct {
	client.Client
	live client.Reader
}

func (l liveReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return l.live.Get(ctx, key, obj, opts...)
}

// askDashboard reads the Ray job from the dashboard, counting failed
// requests in a row.
func (r *Reconciler) askDashboard(ctx context.Context, key types.NamespacedName, st rayv1.RayJobStatus, now time.Time) dashObs {
	cctx, cancel := context.WithTimeout(ctx, DashboardTimeout)
	defer cancel()
	info, err := r.DashboardFor(st.DashboardURL).Get(cctx, st.JobId)
	out := dashObs{asked: true, info: info}
	if errors.Is(err, ErrJobNotFound) {
		out.info, out.notFound, err = nil, true, nil
	}
	f := r.recordDashboard(key, err, now)
	out.err, out.failures, out.since = err, f.n, f.since
	return out
}

// recordDashboard counts a failed request (err != nil) or resets the count.
func (r *Reconciler) recordDashboard(key types.NamespacedName, err error, now time.Time) dashFailures {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unreachable == nil {
		r.unreachable = map[types.NamespacedName]dashFailures{}
	}
	if err == nil {
		delete(r.unreachable, key)
		return dashFailures{}
	}
	f := r.unreachable[key]
	if f.n == 0 {
		f.since = now
	}
	f.n++
	r.unreachable[key] = f
	return f
}
