package rayjob

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/common"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// submitterBackoffLimit is KubeRay's default retries of the submitter Job.
const submitterBackoffLimit = 2

// originLabels mark what a RayJob created, as KubeRay marks it.
func originLabels(j *rayv1.RayJob) map[string]string {
	return map[string]string{
		utils.RayOriginatedFromCRNameLabelKey: j.Name,
		utils.RayOriginatedFromCRDLabelKey:    utils.RayOriginatedFromCRDLabelValue(utils.RayJobCRD),
	}
}

// desiredCluster is the RayCluster a RayJob runs on: its rayClusterSpec,
// the RayJob's labels and annotations, named as the status says.
//
// Every label is copied, as KubeRay v1.5 does (constructRayClusterForRayJob),
// so that the cluster is gang-scheduled as the RayJob asks: the raycluster
// controller reads ray.io/scheduler-name, volcano.sh/queue-name and
// ray.io/priority-class-name from the cluster. Kueue's queue label is copied
// too, and does not queue the cluster a second time: the writer makes the
// cluster controlled by the RayJob in the create itself, and Kueue skips an
// object whose controller is a job it manages (the RayJob, suspended and
// admitted through Kueue's ray.io/rayjob integration). Differences from
// KubeRay: kubectl's last-applied annotation, which describes the RayJob,
// is not copied, nor the UID of the cluster the RayJob's attempt runs on
// (AnnotationClusterUID: an earlier attempt's, on a retry's new cluster).
func desiredCluster(j *rayv1.RayJob, name string) *rayv1.RayCluster {
	labels := make(map[string]string, len(j.Labels)+2)
	for k, v := range j.Labels {
		labels[k] = v
	}
	for k, v := range originLabels(j) {
		labels[k] = v
	}
	var annotations map[string]string
	if len(j.Annotations) > 0 {
		annotations = make(map[string]string, len(j.Annotations))
		for k, v := range j.Annotations {
			if k != corev1.LastAppliedConfigAnnotation && k != AnnotationClusterUID {
				annotations[k] = v
			}
		}
	}
	rc := &rayv1.RayCluster{
		TypeMeta:   metav1.TypeMeta{APIVersion: rayv1.GroupVersion.String(), Kind: "RayCluster"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: j.Namespace, Labels: labels, Annotations: annotations},
	}
	// A finished RayJob is not validated again: its rayClusterSpec may
	// have been edited away since (DeleteWorkers then takes the running
	// cluster's spec).
	if j.Spec.RayClusterSpec != nil {
		rc.Spec = *j.Spec.RayClusterSpec.DeepCopy()
	}
	return rc
}

// desiredSubmitter is KubeRay's submitter Job for the RayJob whose status
// is st (its jobId and dashboardURL): the submitterPodTemplate or KubeRay's
// default one (the head's image), running `ray job submit` against the
// cluster's dashboard unless the template has its own command, with
// PYTHONUNBUFFERED, RAY_DASHBOARD_ADDRESS and RAY_JOB_SUBMISSION_ID.
func desiredSubmitter(j *rayv1.RayJob, st rayv1.RayJobStatus, rc *rayv1.RayCluster) (*batchv1.Job, error) {
	withStatus := j.DeepCopy()
	withStatus.Status = st
	if len(rc.Spec.HeadGroupSpec.Template.Spec.Containers) == 0 && j.Spec.SubmitterPodTemplate == nil {
		return nil, fmt.Errorf("RayCluster %s has no head container to take the submitter's image from", rc.Name)
	}
	tmpl := common.GetSubmitterTemplate(&j.Spec, &rc.Spec)
	if len(tmpl.Spec.Containers) == 0 {
		return nil, fmt.Errorf("spec.submitterPodTemplate has no container")
	}
	cmd, err := common.BuildJobSubmitCommand(withStatus, rayv1.K8sJobMode)
	if err != nil {
		return nil, fmt.Errorf("building the submit command: %w", err)
	}
	shellQuote(cmd, withStatus.Status.JobId)
	// A Job's pods restart Never or OnFailure: a template that says
	// nothing would be defaulted to Always by the API server and the Job
	// refused on every pass (KubeRay v1.5 leaves it so). Always is refused
	// by validate.
	if tmpl.Spec.RestartPolicy == "" {
		tmpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	}
	c := &tmpl.Spec.Containers[utils.RayContainerIndex]
	if len(c.Command) == 0 {
		c.Command = utils.GetContainerCommand([]string{"e"})
		c.Args = []string{strings.Join(cmd, " ")}
	}
	c.Env = append(c.Env,
		corev1.EnvVar{Name: "PYTHONUNBUFFERED", Value: "1"},
		corev1.EnvVar{Name: utils.RAY_DASHBOARD_ADDRESS, Value: st.DashboardURL},
		corev1.EnvVar{Name: utils.RAY_JOB_SUBMISSION_ID, Value: st.JobId})
	limit := ptr.To[int32](submitterBackoffLimit)
	if j.Spec.SubmitterConfig != nil && j.Spec.SubmitterConfig.BackoffLimit != nil {
		limit = j.Spec.SubmitterConfig.BackoffLimit
	}
	// The pods carry the RayJob's origin labels, for kubectl to find them
	// (the status finds them by the Job's selector).
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	for k, v := range originLabels(j) {
		tmpl.Labels[k] = v
	}
	labels := originLabels(j)
	labels[utils.KubernetesCreatedByLabelKey] = utils.ComponentName
	return &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: j.Name, Namespace: j.Namespace, Labels: labels},
		Spec:       batchv1.JobSpec{BackoffLimit: limit, Template: tmpl},
	}, nil
}

// shellQuote single-quotes the words of the submit command that KubeRay
// gives bash in Go's double quotes, the JSON of the runtime env, metadata
// and entrypoint resources (where a $ or ` of the user's, an env var's
// value or a password in a pip index URL, is expanded and Ray given,
// silently, another runtime env than the RayJob's), or as they are, the
// job id (a spec.jobId with a space, a ; or a $ splits the command).
func shellQuote(cmd []string, jobID string) {
	for i := 1; i < len(cmd); i++ {
		switch flag := cmd[i-1]; {
		case flag == "--runtime-env-json" || flag == "--metadata-json" || flag == "--entrypoint-resources":
			if s, err := strconv.Unquote(cmd[i]); err == nil {
				cmd[i] = singleQuoted(s)
			}
		case cmd[i] != jobID || shellSafe.MatchString(jobID):
		case flag == "--submission-id" || flag == "--follow" || (i >= 3 && cmd[i-3] == "status" && cmd[i-2] == "--address"):
			cmd[i] = singleQuoted(jobID)
		}
	}
}

// shellSafe matches a word bash takes as it is.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_.,:/=+@%-]+$`)

func singleQuoted(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// desiredService is KubeRay's RayJob-level head Service (<rayjob>-head-svc),
// which follows the RayJob from cluster to cluster.
func desiredService(ctx context.Context, j *rayv1.RayJob, rc *rayv1.RayCluster) (*corev1.Service, error) {
	svc, err := common.BuildHeadServiceForRayJob(ctx, *j, *rc)
	if err != nil {
		return nil, err
	}
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	svc.OwnerReferences = nil
	return svc, nil
}

// validate is KubeRay's RayJob validation plus what Loom does not run.
func validate(j *rayv1.RayJob) error {
	if err := utils.ValidateRayJobMetadata(j.ObjectMeta); err != nil {
		return err
	}
	if err := utils.ValidateRayJobSpec(j); err != nil {
		return err
	}
	if err := utils.ValidateRayJobStatus(j); err != nil {
		return err
	}
	if j.Spec.SubmissionMode == rayv1.SidecarMode {
		return fmt.Errorf("submissionMode SidecarMode is not supported by Loom: use K8sJobMode, HTTPMode or InteractiveMode")
	}
	if j.Spec.RayClusterSpec != nil && len(j.Spec.RayClusterSpec.HeadGroupSpec.Template.Spec.Containers) == 0 {
		return fmt.Errorf("spec.rayClusterSpec.headGroupSpec.template has no container")
	}
	// As KubeRay v1.6: a retry starts over on a new cluster, and a selected
	// one is never replaced; on the same one, a Ray job left running by a
	// failed submitter would run twice, and a spec.jobId would find the
	// failed job again at once.
	if selectorMode(j) && j.Spec.BackoffLimit != nil && *j.Spec.BackoffLimit > 0 {
		return fmt.Errorf("backoffLimit is incompatible with clusterSelector: a retry starts over on a new RayCluster, and a selected one is never replaced")
	}
	if t := j.Spec.SubmitterPodTemplate; j.Spec.SubmissionMode == rayv1.K8sJobMode && t != nil && t.Spec.RestartPolicy == corev1.RestartPolicyAlways {
		return fmt.Errorf("spec.submitterPodTemplate.spec.restartPolicy must be Never or OnFailure, as a Job's pods, got Always")
	}
	// Ray refuses a job without an entrypoint (`ray job submit` and the
	// Jobs API both): said before a cluster comes up for nothing. A
	// submitter template with its own command does not use it.
	if strings.TrimSpace(j.Spec.Entrypoint) == "" && usesEntrypoint(j) {
		return fmt.Errorf("spec.entrypoint must be set in %s: it is the command the Ray job runs", j.Spec.SubmissionMode)
	}
	// The submitter runs `ray job submit` as one argument of bash, which
	// Linux holds to 128 KiB (MAX_ARG_STRLEN): past it, its pod never
	// starts (argument list too long) and the Job fails after its retries.
	if j.Spec.SubmissionMode == rayv1.K8sJobMode && usesEntrypoint(j) {
		if n := submitCommandSize(j); n >= maxArgStrlen {
			return fmt.Errorf("spec.entrypoint, with runtimeEnvYAML and metadata, makes the submitter's command %d bytes, past the %d a Linux process takes in one argument: use HTTPMode, or keep the code in the image or in a runtime env's working_dir", n, maxArgStrlen)
		}
	}
	// Refused here rather than by the API server when the submitter Job is
	// created, after a cluster has come up for nothing.
	if c := j.Spec.SubmitterConfig; j.Spec.SubmissionMode == rayv1.K8sJobMode && c != nil && c.BackoffLimit != nil && *c.BackoffLimit < 0 {
		return fmt.Errorf("spec.submitterConfig.backoffLimit must not be negative, got %d", *c.BackoffLimit)
	}
	return nil
}

// maxArgStrlen is Linux's bound on one argument of a process, its
// terminating NUL included.
const maxArgStrlen = 128 << 10

// submitCommandSize is the size of the submitter's `ray job submit`
// command for the RayJob, with a job id and dashboard address as long as
// an attempt's (0 if it cannot be built: validated before).
func submitCommandSize(j *rayv1.RayJob) int {
	w := &rayv1.RayJob{ObjectMeta: j.ObjectMeta, Spec: j.Spec}
	w.Status.JobId = j.Spec.JobId
	if w.Status.JobId == "" {
		w.Status.JobId = utils.GenerateRayJobId(j.Name)
	}
	w.Status.DashboardURL = utils.GenerateRayClusterName(j.Name) + "-head-svc." + j.Namespace + ".svc.cluster.local:8265"
	cmd, err := common.BuildJobSubmitCommand(w, rayv1.K8sJobMode)
	if err != nil {
		return 0
	}
	shellQuote(cmd, w.Status.JobId)
	return len(strings.Join(cmd, " ")) + 1
}

// usesEntrypoint reports whether Loom submits spec.entrypoint: in HTTPMode,
// and in K8sJobMode unless the submitter template runs its own command.
func usesEntrypoint(j *rayv1.RayJob) bool {
	switch j.Spec.SubmissionMode {
	case rayv1.HTTPMode:
		return true
	case rayv1.K8sJobMode:
		t := j.Spec.SubmitterPodTemplate
		return t == nil || len(t.Spec.Containers) == 0 || len(t.Spec.Containers[utils.RayContainerIndex].Command) == 0
	}
	return false
}
