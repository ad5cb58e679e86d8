package rayjob

import (
	"errors"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func baseJob(mode rayv1.JobSubmissionMode, jds rayv1.JobDeploymentStatus) *rayv1.RayJob {
	j := &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "rj", Namespace: "ns", Generation: 3}}
	j.Spec.SubmissionMode = mode
	j.Spec.Entrypoint = "python x.py"
	j.Spec.RayClusterSpec = &rayv1.RayClusterSpec{HeadGroupSpec: rayv1.HeadGroupSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "ray-head", Image: "rayproject/ray:2.46.0"}}}}}}
	j.Status.JobDeploymentStatus = jds
	if jds != rayv1.JobDeploymentStatusNew {
		j.Status.JobId, j.Status.RayClusterName = "rj-abcde", "rj-fghij"
		j.Status.StartTime = &metav1.Time{Time: t0.Add(-time.Minute)}
	}
	if jds == rayv1.JobDeploymentStatusRunning {
		j.Status.DashboardURL = "rj-fghij-head-svc.ns.svc.cluster.local:8265"
	}
	return j
}

func readyCluster() *rayv1.RayCluster {
	rc := &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "rj-fghij", Namespace: "ns"}}
	rc.Status.State = rayv1.Ready
	return rc
}

func finishedSubmitter(failed bool) *batchv1.Job {
	c := batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Time{Time: t0.Add(-5 * time.Second)}}
	if failed {
		c.Type, c.Reason, c.Message = batchv1.JobFailed, "BackoffLimitExceeded", "Job has reached the specified backoff limit"
	}
	return &batchv1.Job{Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{c}}}
}

func info(s rayv1.JobStatus, msg string) dashObs {
	i := &utiltypes.RayJobInfo{JobStatus: s, Message: msg, StartTime: uint64(t0.Add(-20 * time.Second).UnixMilli())}
	if rayv1.IsJobTerminal(s) {
		i.EndTime = uint64(t0.Add(-2 * time.Second).UnixMilli())
	}
	return dashObs{asked: true, info: i}
}

func TestDecide(t *testing.T) {
	type want struct {
		jds                                             rayv1.JobDeploymentStatus
		js                                              rayv1.JobStatus
		reason                                          rayv1.JobFailedReason
		msg                                             string
		createCluster, createSubmitter, submit, deleteC bool
		deleteSubmitter, ensureService, deleteSelf      bool
		stopJob                                         bool
		failed, succeeded                               int32
	}
	cases := []struct {
		name string
		edit func(o *observed)
		want want
	}{
		{"new: names the job and cluster first", func(o *observed) { o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusNew) },
			want{jds: rayv1.JobDeploymentStatusInitializing}},
		{"initializing: creates the cluster", func(o *observed) { o.cluster = nil },
			want{jds: rayv1.JobDeploymentStatusInitializing, createCluster: true, msg: "creating RayCluster rj-fghij"}},
		{"initializing: selector cluster missing is said", func(o *observed) {
			o.cluster = nil
			o.job.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "rj-fghij"}
		}, want{jds: rayv1.JobDeploymentStatusInitializing, msg: "does not exist"}},
		{"initializing: waits for ready", func(o *observed) { o.cluster.Status.State = "" },
			want{jds: rayv1.JobDeploymentStatusInitializing, msg: "waiting for RayCluster rj-fghij to be ready"}},
		{"initializing: waits for the head service", func(o *observed) { o.headURL = "" },
			want{jds: rayv1.JobDeploymentStatusInitializing, msg: "head Service"}},
		{"initializing: K8sJobMode creates the submitter", func(*observed) {},
			want{jds: rayv1.JobDeploymentStatusRunning, createSubmitter: true}},
		{"initializing: HTTPMode runs (submits next pass)", func(o *observed) { o.job.Spec.SubmissionMode = rayv1.HTTPMode },
			want{jds: rayv1.JobDeploymentStatusRunning}},
		{"initializing: InteractiveMode waits for a job id", func(o *observed) { o.job.Spec.SubmissionMode = rayv1.InteractiveMode },
			want{jds: rayv1.JobDeploymentStatusWaiting, msg: "set spec.jobId"}},
		{"initializing: suspend", func(o *observed) { o.job.Spec.Suspend = true },
			want{jds: rayv1.JobDeploymentStatusSuspending}},
		{"initializing: deadline", func(o *observed) { o.job.Spec.ActiveDeadlineSeconds = ptr.To[int32](30) },
			want{jds: rayv1.JobDeploymentStatusFailed, reason: rayv1.DeadlineExceeded, failed: 1}},
		{"deadline is not retried", func(o *observed) {
			o.job.Spec.ActiveDeadlineSeconds, o.job.Spec.BackoffLimit = ptr.To[int32](30), ptr.To[int32](3)
		}, want{jds: rayv1.JobDeploymentStatusFailed, reason: rayv1.DeadlineExceeded, failed: 1}},
		{"waiting: user set the job id", func(o *observed) {
			o.job.Spec.SubmissionMode, o.job.Spec.JobId = rayv1.InteractiveMode, "mine"
			o.job.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusWaiting
			o.dash = info(rayv1.JobStatusRunning, "")
		}, want{jds: rayv1.JobDeploymentStatusRunning}},
		{"waiting: a job id the attempt's cluster does not know (an earlier attempt's) is waited on", func(o *observed) {
			o.job.Spec.SubmissionMode, o.job.Spec.JobId = rayv1.InteractiveMode, "mine"
			o.job.Status.JobDeploymentStatus, o.job.Status.JobId = rayv1.JobDeploymentStatusWaiting, ""
			o.job.Status.DashboardURL = "rj-fghij-head-svc.ns.svc.cluster.local:8265"
			o.dash = dashObs{asked: true, notFound: true}
		}, want{jds: rayv1.JobDeploymentStatusWaiting, msg: "waiting for spec.jobId mine to be on RayCluster rj-fghij"}},
		{"waiting: an unreachable dashboard is waited on", func(o *observed) {
			o.job.Spec.SubmissionMode, o.job.Spec.JobId = rayv1.InteractiveMode, "mine"
			o.job.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusWaiting
			o.dash = dashObs{asked: true, err: errors.New("connection refused"), failures: 1, since: t0}
		}, want{jds: rayv1.JobDeploymentStatusWaiting, msg: "connection refused; asking again in 1s"}},
		{"waiting: a cluster deleted fails the RayJob at once, not after a pass Running", func(o *observed) {
			o.job.Spec.SubmissionMode, o.job.Spec.JobId = rayv1.InteractiveMode, "mine"
			o.job.Status.JobDeploymentStatus, o.job.Status.JobId = rayv1.JobDeploymentStatusWaiting, ""
			o.job.Status.DashboardURL = "rj-fghij-head-svc.ns.svc.cluster.local:8265"
			o.cluster = nil
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed,
			msg: "RayCluster rj-fghij was deleted while the RayJob waited for its Ray job (spec.jobId)", failed: 1}},
		{"waiting for spec.jobId: a cluster deleted fails the RayJob instead of waiting for ever", func(o *observed) {
			o.job.Spec.SubmissionMode = rayv1.InteractiveMode
			o.job.Status.JobDeploymentStatus, o.job.Status.JobId = rayv1.JobDeploymentStatusWaiting, ""
			o.job.Status.DashboardURL = "rj-fghij-head-svc.ns.svc.cluster.local:8265"
			o.cluster = nil
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, msg: "was deleted while the RayJob waited", failed: 1}},
		{"waiting: a cluster being deleted fails the RayJob", func(o *observed) {
			o.job.Spec.SubmissionMode, o.job.Spec.JobId = rayv1.InteractiveMode, "mine"
			o.job.Status.JobDeploymentStatus, o.job.Status.JobId = rayv1.JobDeploymentStatusWaiting, ""
			o.cluster.DeletionTimestamp = &metav1.Time{Time: t0}
			o.dash = info(rayv1.JobStatusRunning, "")
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, msg: "was deleted while the RayJob waited", failed: 1}},
		{"waiting: a selected cluster created again under its name is not the attempt's", func(o *observed) {
			o.job.Spec.SubmissionMode, o.job.Spec.JobId = rayv1.InteractiveMode, "mine"
			o.job.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "rj-fghij"}
			o.job.Status.JobDeploymentStatus, o.job.Status.JobId = rayv1.JobDeploymentStatusWaiting, ""
			o.job.Annotations = map[string]string{AnnotationClusterUID: "uid-1"}
			o.cluster, o.replacedBy = nil, "uid-2"
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, msg: "was deleted and created again (UID uid-1, now uid-2)", failed: 1}},
		{"running: HTTPMode submits what the dashboard does not know", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.dash = dashObs{asked: true, notFound: true}
		}, want{jds: rayv1.JobDeploymentStatusRunning, submit: true, ensureService: true, msg: "submitting Ray job rj-abcde"}},
		{"running: HTTPMode does not submit what the dashboard knows", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.dash = info(rayv1.JobStatusPending, "pending")
		}, want{jds: rayv1.JobDeploymentStatusRunning, js: rayv1.JobStatusPending, ensureService: true, msg: "pending"}},
		{"running: dashboard unreachable waits with backoff in the message", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.dash = dashObs{asked: true, err: errors.New("connection refused"), failures: 3, since: t0.Add(-10 * time.Second)}
		}, want{jds: rayv1.JobDeploymentStatusRunning, ensureService: true, msg: "3 failed requests since 2026-01-02T03:03:55Z): connection refused; asking again in 4s"}},
		{"running: K8sJobMode waits for the submitter to submit", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.submitter = &batchv1.Job{}
			o.dash = dashObs{asked: true, notFound: true}
		}, want{jds: rayv1.JobDeploymentStatusRunning, ensureService: true, msg: "waiting for the submitter Job rj"}},
		{"running: the submitter pod's trouble is said", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.submitter = &batchv1.Job{}
			o.dash = dashObs{asked: true, notFound: true}
			o.submitterTrouble = "pod rj-x7k2p not placed: 0/3 nodes are available"
		}, want{jds: rayv1.JobDeploymentStatusRunning, ensureService: true,
			msg: "waiting for the submitter Job rj to submit Ray job rj-abcde: pod rj-x7k2p not placed: 0/3 nodes are available"}},
		{"running: K8sJobMode terminal job waits for the submitter", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.submitter = &batchv1.Job{}
			o.dash = info(rayv1.JobStatusSucceeded, "ok")
		}, want{jds: rayv1.JobDeploymentStatusRunning, js: rayv1.JobStatusSucceeded, ensureService: true, msg: "ok"}},
		{"running: K8sJobMode succeeded", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.submitter = finishedSubmitter(false)
			o.dash = info(rayv1.JobStatusSucceeded, "ok")
		}, want{jds: rayv1.JobDeploymentStatusComplete, js: rayv1.JobStatusSucceeded, ensureService: true, msg: "ok", succeeded: 1}},
		{"running: submitter failed, the Ray job it may have submitted is stopped", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.submitter = finishedSubmitter(true)
		}, want{jds: rayv1.JobDeploymentStatusFailed, reason: rayv1.SubmissionFailed, ensureService: true, msg: "BackoffLimitExceeded", stopJob: true, failed: 1}},
		{"running: submitter failed after the Ray job failed", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.job.Status.JobStatus = rayv1.JobStatusFailed
			o.submitter = finishedSubmitter(true)
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, ensureService: true, failed: 1}},
		{"running: a Ray job still running long after its submitter finished is stopped", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.job.Status.JobStatus = rayv1.JobStatusRunning
			o.submitter = finishedSubmitter(false)
			o.submitter.Status.Conditions[0].LastTransitionTime = metav1.Time{Time: t0.Add(-time.Minute)}
			o.dash = info(rayv1.JobStatusRunning, "")
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.JobDeploymentStatusTransitionGracePeriodExceeded,
			ensureService: true, msg: "did not reach a terminal state", stopJob: true, failed: 1}},
		{"running: submitter done, job unknown", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.submitter = finishedSubmitter(false)
			o.dash = dashObs{asked: true, notFound: true}
		}, want{jds: rayv1.JobDeploymentStatusFailed, reason: rayv1.AppFailed, ensureService: true, msg: "not found", failed: 1}},
		{"running: failed job with a retry left", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.job.Spec.BackoffLimit = ptr.To[int32](1)
			o.dash = info(rayv1.JobStatusFailed, "exit code 1")
		}, want{jds: rayv1.JobDeploymentStatusRetrying, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, ensureService: true, msg: "attempt 1 of 2 failed", failed: 1}},
		{"running: failed job, no retry left", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.job.Spec.BackoffLimit = ptr.To[int32](1)
			o.job.Status.Failed = ptr.To[int32](1)
			o.dash = info(rayv1.JobStatusFailed, "exit code 1")
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, ensureService: true, msg: "exit code 1", failed: 2}},
		{"running: past the deadline, the Ray job is stopped", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.job.Spec.ActiveDeadlineSeconds, o.job.Status.JobStatus = ptr.To[int32](30), rayv1.JobStatusRunning
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusRunning, reason: rayv1.DeadlineExceeded, stopJob: true, failed: 1}},
		{"running: past the deadline, a finished Ray job is left alone", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.job.Spec.ActiveDeadlineSeconds, o.job.Status.JobStatus = ptr.To[int32](30), rayv1.JobStatusSucceeded
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusSucceeded, reason: rayv1.DeadlineExceeded, failed: 1}},
		{"running: suspend", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.job.Spec.Suspend = true
		}, want{jds: rayv1.JobDeploymentStatusSuspending}},
		{"running: the cluster deleted by hand fails the attempt, not made again", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.job.Status.JobStatus = rayv1.JobStatusRunning
			o.cluster = nil
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, msg: "RayCluster rj-fghij was deleted while the RayJob ran on it", failed: 1}},
		{"running: the cluster being deleted by hand is retried on a new one", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.job.Spec.BackoffLimit = ptr.To[int32](1)
			o.cluster.DeletionTimestamp = &metav1.Time{Time: t0}
		}, want{jds: rayv1.JobDeploymentStatusRetrying, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, msg: "attempt 1 of 2 failed", failed: 1}},
		{"running: the cluster deleted after the Ray job succeeded", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.job.Status.JobStatus = rayv1.JobStatusSucceeded
			o.cluster = nil
		}, want{jds: rayv1.JobDeploymentStatusComplete, js: rayv1.JobStatusSucceeded, msg: "ended SUCCEEDED", succeeded: 1}},
		{"running: HTTPMode submits a job the dashboard does not have", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.dash = dashObs{asked: true, notFound: true}
		}, want{jds: rayv1.JobDeploymentStatusRunning, submit: true, ensureService: true, msg: "submitting Ray job rj-abcde"}},
		{"running: HTTPMode does not submit again a job the dashboard had", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.job.Status.JobStatus = rayv1.JobStatusRunning
			o.dash = dashObs{asked: true, notFound: true}
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, ensureService: true, failed: 1,
			msg: "Ray job rj-abcde, which the dashboard had as RUNNING, is no longer on RayCluster rj-fghij"}},
		{"running: a selected cluster deleted fails the attempt naming it", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusRunning)
			o.job.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "rj-fghij"}
			o.job.Status.JobStatus = rayv1.JobStatusRunning
			o.cluster = nil
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, failed: 1,
			msg: "RayCluster rj-fghij (picked by the clusterSelector) was deleted while the RayJob ran on it: Ray job rj-abcde is lost with it"}},
		{"running: a selected cluster being deleted fails the attempt", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.job.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "rj-fghij"}
			o.cluster.DeletionTimestamp = &metav1.Time{Time: t0}
		}, want{jds: rayv1.JobDeploymentStatusFailed, js: rayv1.JobStatusFailed, reason: rayv1.AppFailed, failed: 1, msg: "(picked by the clusterSelector) was deleted"}},
		{"running: a selected cluster deleted after the Ray job succeeded", func(o *observed) {
			o.job = baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
			o.job.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "rj-fghij"}
			o.job.Status.JobStatus = rayv1.JobStatusSucceeded
			o.cluster = nil
		}, want{jds: rayv1.JobDeploymentStatusComplete, js: rayv1.JobStatusSucceeded, msg: "ended SUCCEEDED", succeeded: 1}},
		{"retrying: deletes the cluster and the submitter first", func(o *observed) {
			o.job.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusRetrying
			o.submitter = &batchv1.Job{}
		}, want{jds: rayv1.JobDeploymentStatusRetrying, deleteC: true, deleteSubmitter: true, msg: "before retrying"}},
		{"retrying: then starts over with new names", func(o *observed) {
			o.job.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusRetrying
			o.cluster = nil
		}, want{jds: rayv1.JobDeploymentStatusNew}},
		{"retrying: a selected cluster is never deleted", func(o *observed) {
			o.job.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusRetrying
			o.job.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "rj-fghij"}
		}, want{jds: rayv1.JobDeploymentStatusNew}},
		{"suspending: then suspended", func(o *observed) {
			o.job.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusSuspending
			o.job.Spec.Suspend = true
			o.cluster = nil
		}, want{jds: rayv1.JobDeploymentStatusSuspended}},
		{"suspended: resumed", func(o *observed) { o.job.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusSuspended },
			want{jds: rayv1.JobDeploymentStatusNew}},
		{"invalid spec", func(o *observed) {
			o.job = baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusNew)
			o.invalid = errors.New("The RayJob spec is invalid: x")
		},
			want{jds: rayv1.JobDeploymentStatusValidationFailed, reason: rayv1.ValidationFailed, msg: "spec is invalid"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := observed{job: baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusInitializing), cluster: readyCluster(),
				headURL: "rj-fghij-head-svc.ns.svc.cluster.local:8265", now: t0, newJobID: "rj-new01", newCluster: "rj-new02"}
			tc.edit(&o)
			d := decide(o)
			st, w := d.status, tc.want
			if st.JobDeploymentStatus != w.jds || st.JobStatus != w.js || st.Reason != w.reason || !strings.Contains(st.Message, w.msg) {
				t.Errorf("status %q/%q reason %q message %q, want %q/%q %q containing %q", st.JobDeploymentStatus, st.JobStatus, st.Reason, st.Message, w.jds, w.js, w.reason, w.msg)
			}
			if d.createCluster != w.createCluster || d.createSubmitter != w.createSubmitter || d.submit != w.submit || d.deleteCluster != w.deleteC ||
				d.deleteSubmitter != w.deleteSubmitter || d.ensureService != w.ensureService || d.deleteSelf != w.deleteSelf || (d.stopJob != "") != w.stopJob {
				t.Errorf("actions %+v, want %+v", d, w)
			}
			if w.jds != rayv1.JobDeploymentStatusValidationFailed && w.jds != rayv1.JobDeploymentStatusSuspended && w.jds != rayv1.JobDeploymentStatusNew &&
				(ptr.Deref(st.Failed, 0) != w.failed || ptr.Deref(st.Succeeded, 0) != w.succeeded) {
				t.Errorf("failed %v succeeded %v, want %d %d", st.Failed, st.Succeeded, w.failed, w.succeeded)
			}
			if st.ObservedGeneration != 3 {
				t.Errorf("observedGeneration %d", st.ObservedGeneration)
			}
		})
	}
}

func TestDecideNamesOnce(t *testing.T) {
	o := observed{job: baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusNew), now: t0, newJobID: "rj-aaaaa", newCluster: "rj-bbbbb"}
	st := decide(o).status
	if st.JobId != "rj-aaaaa" || st.RayClusterName != "rj-bbbbb" || !st.StartTime.Equal(&metav1.Time{Time: t0}) {
		t.Fatalf("new: %+v", st)
	}
	o.job.Spec.JobId = "given"
	o.job.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "theirs"}
	if st := decide(o).status; st.JobId != "given" || st.RayClusterName != "theirs" {
		t.Fatalf("spec names: %+v", st)
	}
	o.job.Spec.SubmissionMode = rayv1.InteractiveMode
	if st := decide(o).status; st.JobId != "" {
		t.Fatalf("InteractiveMode has no job id before the user's: %+v", st)
	}
	// A retry draws new names: the reset status is New again.
	r := baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRetrying)
	st = decide(observed{job: r, now: t0}).status
	if st.JobId != "" || st.RayClusterName != "" || st.JobDeploymentStatus != rayv1.JobDeploymentStatusNew {
		t.Fatalf("retry reset: %+v", st)
	}
}

func TestDecideEndTime(t *testing.T) {
	o := observed{job: baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning), cluster: readyCluster(), now: t0, dash: info(rayv1.JobStatusSucceeded, "ok")}
	st := decide(o).status
	if st.EndTime == nil || !st.EndTime.Time.Equal(t0) || st.RayJobStatusInfo.EndTime == nil || st.RayJobStatusInfo.StartTime == nil {
		t.Fatalf("end times: %+v", st)
	}
}

func TestFinished(t *testing.T) {
	policy := func(p rayv1.DeletionPolicyType) *rayv1.DeletionPolicy { return &rayv1.DeletionPolicy{Policy: &p} }
	cases := []struct {
		name                               string
		edit                               func(j *rayv1.RayJob, o *observed)
		deleteCluster, suspend, deleteSelf bool
		requeue                            time.Duration
	}{
		{"nothing asked", func(*rayv1.RayJob, *observed) {}, false, false, false, 0},
		{"shutdown before the TTL waits", func(j *rayv1.RayJob, _ *observed) {
			j.Spec.ShutdownAfterJobFinishes, j.Spec.TTLSecondsAfterFinished = true, 60
		},
			false, false, false, 51 * time.Second},
		{"shutdown after the TTL deletes the cluster", func(j *rayv1.RayJob, _ *observed) {
			j.Spec.ShutdownAfterJobFinishes, j.Spec.TTLSecondsAfterFinished = true, 5
		},
			true, false, false, 0},
		{"shutdown, cluster already gone", func(j *rayv1.RayJob, o *observed) { j.Spec.ShutdownAfterJobFinishes = true; o.cluster = nil },
			false, false, false, 0},
		{"shutdown under DELETE_RAYJOB_CR_AFTER_JOB_FINISHES before the TTL waits", func(j *rayv1.RayJob, o *observed) {
			j.Spec.ShutdownAfterJobFinishes, j.Spec.TTLSecondsAfterFinished, o.deleteAfterShutdown = true, 60, true
		},
			false, false, false, 51 * time.Second},
		{"shutdown under DELETE_RAYJOB_CR_AFTER_JOB_FINISHES deletes the RayJob", func(j *rayv1.RayJob, o *observed) {
			j.Spec.ShutdownAfterJobFinishes, j.Spec.TTLSecondsAfterFinished, o.deleteAfterShutdown = true, 5, true
		},
			false, false, true, 0},
		{"shutdown under DELETE_RAYJOB_CR_AFTER_JOB_FINISHES, cluster already gone, deletes the RayJob", func(j *rayv1.RayJob, o *observed) {
			j.Spec.ShutdownAfterJobFinishes, o.deleteAfterShutdown, o.cluster = true, true, nil
		},
			false, false, true, 0},
		{"DELETE_RAYJOB_CR_AFTER_JOB_FINISHES: a selected cluster's RayJob is left alone", func(j *rayv1.RayJob, o *observed) {
			j.Spec.ShutdownAfterJobFinishes, o.deleteAfterShutdown = true, true
			j.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "x"}
		}, false, false, false, 0},
		{"DELETE_RAYJOB_CR_AFTER_JOB_FINISHES without shutdownAfterJobFinishes keeps all", func(_ *rayv1.RayJob, o *observed) { o.deleteAfterShutdown = true },
			false, false, false, 0},
		{"selected cluster is left alone", func(j *rayv1.RayJob, _ *observed) {
			j.Spec.ShutdownAfterJobFinishes = true
			j.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "x"}
		}, false, false, false, 0},
		{"selected cluster, shutdown after a TTL: nothing to look again for", func(j *rayv1.RayJob, _ *observed) {
			j.Spec.ShutdownAfterJobFinishes, j.Spec.TTLSecondsAfterFinished = true, 60
			j.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "x"}
		}, false, false, false, 0},
		{"selected cluster: a DeleteSelf rule deletes the RayJob", func(j *rayv1.RayJob, _ *observed) {
			j.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "x"}
			j.Spec.DeletionStrategy = &rayv1.DeletionStrategy{DeletionRules: []rayv1.DeletionRule{
				{Policy: rayv1.DeleteSelf, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusSucceeded}},
			}}
		}, false, false, true, 0},
		{"selected cluster: legacy onSuccess DeleteSelf deletes the RayJob", func(j *rayv1.RayJob, _ *observed) {
			j.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "x"}
			j.Spec.DeletionStrategy = &rayv1.DeletionStrategy{OnSuccess: policy(rayv1.DeleteSelf), OnFailure: policy(rayv1.DeleteNone)}
		}, false, false, true, 0},
		{"selected cluster: a DeleteCluster rule (edited in after the end) leaves it alone", func(j *rayv1.RayJob, o *observed) {
			j.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "x"}
			j.Spec.DeletionStrategy = &rayv1.DeletionStrategy{DeletionRules: []rayv1.DeletionRule{
				{Policy: rayv1.DeleteCluster, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusSucceeded}},
				{Policy: rayv1.DeleteWorkers, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusSucceeded}},
			}}
			o.cluster.Spec.WorkerGroupSpecs = []rayv1.WorkerGroupSpec{{GroupName: "w"}}
		}, false, false, false, 0},
		{"legacy onSuccess DeleteWorkers", func(j *rayv1.RayJob, o *observed) {
			j.Spec.DeletionStrategy = &rayv1.DeletionStrategy{OnSuccess: policy(rayv1.DeleteWorkers), OnFailure: policy(rayv1.DeleteNone)}
			o.cluster.Spec.WorkerGroupSpecs = []rayv1.WorkerGroupSpec{{GroupName: "w"}}
		}, false, true, false, 0},
		{"rules: the most impactful due rule", func(j *rayv1.RayJob, _ *observed) {
			j.Spec.DeletionStrategy = &rayv1.DeletionStrategy{DeletionRules: []rayv1.DeletionRule{
				{Policy: rayv1.DeleteWorkers, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusSucceeded}},
				{Policy: rayv1.DeleteCluster, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusSucceeded, TTLSeconds: 5}},
				{Policy: rayv1.DeleteSelf, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusSucceeded, TTLSeconds: 100}},
				{Policy: rayv1.DeleteSelf, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusFailed}},
			}}
		}, true, false, false, 91 * time.Second},
		{"rules: DeleteSelf when due", func(j *rayv1.RayJob, _ *observed) {
			j.Spec.DeletionStrategy = &rayv1.DeletionStrategy{DeletionRules: []rayv1.DeletionRule{
				{Policy: rayv1.DeleteSelf, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusSucceeded}},
			}}
		}, false, false, true, 0},
		{"rules: past its deadline, its Ray job stopped while RUNNING, the RayJob failed", func(j *rayv1.RayJob, _ *observed) {
			j.Status.JobDeploymentStatus, j.Status.Reason, j.Status.JobStatus = rayv1.JobDeploymentStatusFailed, rayv1.DeadlineExceeded, rayv1.JobStatusRunning
			j.Spec.DeletionStrategy = &rayv1.DeletionStrategy{DeletionRules: []rayv1.DeletionRule{
				{Policy: rayv1.DeleteCluster, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusFailed}},
			}}
		}, true, false, false, 0},
		{"legacy onFailure: a deadline in Initializing, nothing ran, the RayJob failed", func(j *rayv1.RayJob, _ *observed) {
			j.Status.JobDeploymentStatus, j.Status.Reason, j.Status.JobStatus = rayv1.JobDeploymentStatusFailed, rayv1.DeadlineExceeded, ""
			j.Spec.DeletionStrategy = &rayv1.DeletionStrategy{OnSuccess: policy(rayv1.DeleteNone), OnFailure: policy(rayv1.DeleteCluster)}
		}, true, false, false, 0},
		{"rules: a Ray job that SUCCEEDED is matched as such, whatever the RayJob", func(j *rayv1.RayJob, _ *observed) {
			j.Status.JobDeploymentStatus, j.Status.Reason = rayv1.JobDeploymentStatusFailed, rayv1.DeadlineExceeded
			j.Spec.DeletionStrategy = &rayv1.DeletionStrategy{DeletionRules: []rayv1.DeletionRule{
				{Policy: rayv1.DeleteCluster, Condition: rayv1.DeletionCondition{JobStatus: rayv1.JobStatusFailed}},
			}}
		}, false, false, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusComplete)
			j.Status.JobStatus = rayv1.JobStatusSucceeded
			j.Status.EndTime = &metav1.Time{Time: t0.Add(-10 * time.Second)}
			o := observed{job: j, cluster: readyCluster(), now: t0}
			tc.edit(j, &o)
			d := decide(o)
			if d.deleteCluster != tc.deleteCluster || d.suspendWorkers != tc.suspend || d.deleteSelf != tc.deleteSelf || d.requeue != tc.requeue {
				t.Fatalf("deleteCluster %v suspendWorkers %v deleteSelf %v requeue %s", d.deleteCluster, d.suspendWorkers, d.deleteSelf, d.requeue)
			}
			if d.status.JobDeploymentStatus != j.Status.JobDeploymentStatus {
				t.Fatalf("status moved: %q", d.status.JobDeploymentStatus)
			}
		})
	}
}

// A finished RayJob whose spec is edited into an invalid one stays
// finished (its clean-up still runs), and the spec mended does not start
// it over: the finished Ray job is never run again.
func TestFinishedRayJobIgnoresAnInvalidEdit(t *testing.T) {
	for _, jds := range []rayv1.JobDeploymentStatus{rayv1.JobDeploymentStatusComplete, rayv1.JobDeploymentStatusFailed} {
		j := baseJob(rayv1.K8sJobMode, jds)
		j.Status.JobStatus, j.Status.EndTime, j.Status.Message = rayv1.JobStatusSucceeded, &metav1.Time{Time: t0.Add(-time.Minute)}, "Job finished successfully."
		j.Spec.ShutdownAfterJobFinishes = true
		o := observed{job: j, cluster: readyCluster(), now: t0, invalid: errors.New("The RayJob spec is invalid: x")}
		d := decide(o)
		if d.status.JobDeploymentStatus != jds || d.status.Message != "Job finished successfully." || !d.deleteCluster {
			t.Fatalf("%s, edited invalid: status %q %q, deleteCluster %v; want it kept and the cluster deleted", jds, d.status.JobDeploymentStatus, d.status.Message, d.deleteCluster)
		}
		j.Status, o.invalid, o.cluster = d.status, nil, nil
		if d := decide(o); d.status.JobDeploymentStatus != jds || d.createCluster || d.createSubmitter || d.submit {
			t.Fatalf("%s, mended: status %q, actions %+v", jds, d.status.JobDeploymentStatus, d)
		}
	}
}

// A started RayJob (Initializing, Waiting, Running) whose spec is edited
// into an invalid one holds where it is, its Ray job followed: nothing is
// created, deleted, submitted or stopped, and no state is left, so its
// cluster stays owned and followed; a Warning says why, once. One
// releasing its cluster goes on releasing it; one of which nothing runs is
// ValidationFailed.
func TestAStartedRayJobHoldsOnAnInvalidEdit(t *testing.T) {
	invalid := errors.New("The RayJob spec is invalid: x")
	for _, tc := range []struct {
		name string
		o    observed
		js   rayv1.JobStatus
	}{
		{"initializing, its cluster missing", observed{job: baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusInitializing)}, ""},
		{"waiting for spec.jobId", observed{job: baseJob(rayv1.InteractiveMode, rayv1.JobDeploymentStatusWaiting), cluster: readyCluster()}, ""},
		{"waiting, the user's spec.jobId asked of the dashboard", observed{job: baseJob(rayv1.InteractiveMode, rayv1.JobDeploymentStatusWaiting), cluster: readyCluster(),
			dash: info(rayv1.JobStatusRunning, "")}, ""},
		{"running, its Ray job done", observed{job: baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning), cluster: readyCluster(),
			dash: info(rayv1.JobStatusSucceeded, "done")}, rayv1.JobStatusSucceeded},
		{"running, the Ray job unknown", observed{job: baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning), cluster: readyCluster(),
			dash: dashObs{asked: true, notFound: true}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.now, o.invalid = t0, invalid
			d := decide(o)
			st := d.status
			if st.JobDeploymentStatus != o.job.Status.JobDeploymentStatus || st.JobStatus != tc.js || !strings.Contains(st.Message, "holds as it is until its spec is mended") ||
				!strings.Contains(st.Message, invalid.Error()) || st.ObservedGeneration != 3 {
				t.Fatalf("status %+v, want %q held, job status %q, saying why", st, o.job.Status.JobDeploymentStatus, tc.js)
			}
			if d.createCluster || d.createSubmitter || d.ensureService || d.submit || d.deleteCluster || d.deleteSubmitter || d.suspendWorkers || d.stopJob != "" || d.deleteSelf {
				t.Fatalf("actions on an invalid spec: %+v", d)
			}
			if d.warn.reason != "InvalidRayJobSpec" {
				t.Fatalf("warning %+v", d.warn)
			}
			o.job.Status = st
			if d := decide(o); d.warn.reason != "" {
				t.Fatalf("warned again: %+v", d.warn)
			}
		})
	}
	suspending := baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusSuspending)
	if d := decide(observed{job: suspending, cluster: readyCluster(), now: t0, invalid: invalid}); !d.deleteCluster || d.status.JobDeploymentStatus != rayv1.JobDeploymentStatusSuspending {
		t.Fatalf("suspending, edited invalid: %+v", d)
	}
	for _, jds := range []rayv1.JobDeploymentStatus{rayv1.JobDeploymentStatusNew, rayv1.JobDeploymentStatusSuspended} {
		if d := decide(observed{job: baseJob(rayv1.K8sJobMode, jds), now: t0, invalid: invalid}); d.status.JobDeploymentStatus != rayv1.JobDeploymentStatusValidationFailed {
			t.Fatalf("%q, edited invalid: %q", jds, d.status.JobDeploymentStatus)
		}
	}
}

// The deadline is kept while a started RayJob holds on an invalid edit: past
// it, the RayJob fails (DeadlineExceeded, counted, its end stamped) and its
// Ray job is stopped, as without the edit; before it, the held RayJob is
// looked at again when it comes, even with nothing to poll.
func TestAHeldRayJobFailsAtItsDeadline(t *testing.T) {
	invalid := errors.New("The RayJob spec is invalid: x")
	running := baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
	running.Spec.ActiveDeadlineSeconds, running.Status.JobStatus = ptr.To[int32](30), rayv1.JobStatusRunning
	d := decide(observed{job: running, cluster: readyCluster(), now: t0, invalid: invalid, dash: info(rayv1.JobStatusRunning, "")})
	st := d.status
	if st.JobDeploymentStatus != rayv1.JobDeploymentStatusFailed || st.Reason != rayv1.DeadlineExceeded || d.stopJob == "" ||
		ptr.Deref(st.Failed, 0) != 1 || st.EndTime == nil || !st.EndTime.Time.Equal(t0) {
		t.Fatalf("held past its deadline: status %+v, stopJob %v; want Failed (DeadlineExceeded), counted, ended, its Ray job stopped", st, d.stopJob)
	}
	for _, jds := range []rayv1.JobDeploymentStatus{rayv1.JobDeploymentStatusInitializing, rayv1.JobDeploymentStatusWaiting} {
		j := baseJob(rayv1.InteractiveMode, jds)
		j.Spec.ActiveDeadlineSeconds = ptr.To[int32](70) // 10 s left
		o := observed{job: j, cluster: readyCluster(), now: t0, invalid: invalid}
		if d := decide(o); d.status.JobDeploymentStatus != jds || d.requeue != 11*time.Second {
			t.Fatalf("%s, held 10 s before its deadline: %q, requeue %s; want held, looked at again at the deadline", jds, d.status.JobDeploymentStatus, d.requeue)
		}
		o.now = t0.Add(11 * time.Second)
		if d := decide(o); d.status.JobDeploymentStatus != rayv1.JobDeploymentStatusFailed || d.status.Reason != rayv1.DeadlineExceeded {
			t.Fatalf("%s, held past its deadline: %+v", jds, d.status)
		}
	}
}

// An InteractiveMode RayJob waiting for spec.jobId is suspended (Kueue takes
// its cluster back) and fails at its deadline, looked at again then; KubeRay
// v1.5 waits on whatever they say.
func TestAWaitingRayJobHonoursSuspendAndItsDeadline(t *testing.T) {
	j := baseJob(rayv1.InteractiveMode, rayv1.JobDeploymentStatusWaiting)
	j.Status.JobId, j.Status.DashboardURL = "", "rj-fghij-head-svc.ns.svc.cluster.local:8265" // the user submits it
	j.Spec.Suspend, j.Spec.ShutdownAfterJobFinishes = true, true
	o := observed{job: j, cluster: readyCluster(), now: t0}
	if d := decide(o); d.status.JobDeploymentStatus != rayv1.JobDeploymentStatusSuspending {
		t.Fatalf("waiting, suspended: %q, want Suspending", d.status.JobDeploymentStatus)
	}
	j.Spec.Suspend = false
	j.Spec.ActiveDeadlineSeconds = ptr.To[int32](30)
	if d := decide(o); d.status.JobDeploymentStatus != rayv1.JobDeploymentStatusFailed || d.status.Reason != rayv1.DeadlineExceeded || d.stopJob != "" {
		t.Fatalf("waiting past its deadline: %+v stopJob %v, want Failed (DeadlineExceeded), no Ray job to stop", d.status, d.stopJob)
	}
}

// An unreachable dashboard's backoff does not carry a RayJob past its
// deadline: it is looked at again when the deadline comes, and the status
// message says when that is.
func TestDecideLooksAgainAtTheDeadline(t *testing.T) {
	o := observed{job: baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning), cluster: readyCluster(), now: t0,
		dash: dashObs{asked: true, err: errors.New("connection refused"), failures: 9, since: t0.Add(-5 * time.Minute)}}
	if d := decide(o); d.requeue != time.Minute {
		t.Fatalf("no deadline: requeue %s, want the backoff's minute", d.requeue)
	}
	o.job.Spec.ActiveDeadlineSeconds = ptr.To[int32](70) // 10 s left
	if d := decide(o); d.requeue != 11*time.Second || !strings.HasSuffix(d.status.Message, "asking again in 11s") {
		t.Fatalf("10 s before the deadline: requeue %s, message %q; want 11s, and the message saying so", d.requeue, d.status.Message)
	}
}

func TestDashboardBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 7: time.Minute, 100: time.Minute} {
		if got := dashboardBackoff(n); got != want {
			t.Errorf("dashboardBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}

// An InteractiveMode RayJob suspended while its Ray job ran, then resumed,
// starts clean on its new cluster: the earlier attempt's ids are cleared,
// and spec.jobId, which names the Ray job that went with the old cluster,
// is not followed until the new cluster's dashboard has a job of that id
// (the user submits the new attempt's job); KubeRay v1.5 goes straight to
// Running following a job no one submitted to the new cluster.
func TestAResumedInteractiveRayJobWaitsForItsNewJob(t *testing.T) {
	j := baseJob(rayv1.InteractiveMode, rayv1.JobDeploymentStatusRunning)
	j.Spec.JobId, j.Status.JobId, j.Status.JobStatus = "mine", "mine", rayv1.JobStatusRunning
	step := func(o observed) rayv1.RayJobStatus {
		t.Helper()
		d := decide(o)
		j.Status = d.status
		return d.status
	}
	j.Spec.Suspend = true
	step(observed{job: j, cluster: readyCluster(), now: t0})
	if st := step(observed{job: j, now: t0}); st.JobDeploymentStatus != rayv1.JobDeploymentStatusSuspended || st.JobId != "" || st.RayClusterName != "" || st.DashboardURL != "" {
		t.Fatalf("suspended: %+v, want the attempt's ids cleared", st)
	}
	j.Spec.Suspend = false
	step(observed{job: j, now: t0})
	step(observed{job: j, now: t0, newCluster: "rj-new02", newJobID: "rj-new01"})
	rc := readyCluster()
	rc.Name = "rj-new02"
	url := "rj-new02-head-svc.ns.svc.cluster.local:8265"
	if st := step(observed{job: j, cluster: rc, headURL: url, now: t0}); st.JobDeploymentStatus != rayv1.JobDeploymentStatusWaiting || st.JobId != "" {
		t.Fatalf("resumed: %+v, want Waiting without a job id", st)
	}
	st := step(observed{job: j, cluster: rc, now: t0, dash: dashObs{asked: true, notFound: true}})
	if st.JobDeploymentStatus != rayv1.JobDeploymentStatusWaiting || st.JobId != "" || !strings.Contains(st.Message, "earlier attempt") {
		t.Fatalf("resumed, the old spec.jobId not on the new cluster: %+v, want Waiting for it", st)
	}
	st = step(observed{job: j, cluster: rc, now: t0, dash: info(rayv1.JobStatusRunning, "")})
	if st.JobDeploymentStatus != rayv1.JobDeploymentStatusRunning || st.JobId != "mine" || st.RayClusterName != "rj-new02" || st.DashboardURL != url {
		t.Fatalf("resumed, the job submitted to the new cluster: %+v, want Running it", st)
	}
}

// A RayJob that gave up on a Ray job the dashboard last said ran asks to
// stop it again while its cluster stands (the stop of the pass that failed
// it did not go through, or the manager went down first), until
// stopRetryWindow after its end; not once the job is STOPPED, the cluster
// gone or going, or the window over.
func TestAGivenUpRayJobIsStoppedAgain(t *testing.T) {
	cases := []struct {
		name string
		edit func(o *observed)
		want string
	}{
		{"past its deadline, running", func(*observed) {}, "past the activeDeadlineSeconds"},
		{"on a selected cluster", func(o *observed) { o.job.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "rj-fghij"} }, "past the activeDeadlineSeconds"},
		{"its submitter failed", func(o *observed) { o.job.Status.Reason = rayv1.SubmissionFailed }, "after its submitter Job failed"},
		{"still running after its submitter finished", func(o *observed) {
			o.job.Status.JobStatus, o.job.Status.Reason = rayv1.JobStatusFailed, rayv1.JobDeploymentStatusTransitionGracePeriodExceeded
		}, "still running after its submitter Job finished"},
		{"terminal too long", func(o *observed) {
			o.job.Status.JobStatus, o.job.Status.Reason = rayv1.JobStatusFailed, rayv1.JobDeploymentStatusTransitionGracePeriodExceeded
			o.job.Status.RayJobStatusInfo.EndTime = &metav1.Time{Time: t0.Add(-10 * time.Minute)}
		}, ""},
		{"failed", func(o *observed) {
			o.job.Status.JobStatus, o.job.Status.Reason = rayv1.JobStatusFailed, rayv1.AppFailed
		}, ""},
		{"stopped", func(o *observed) { o.job.Status.JobStatus = rayv1.JobStatusStopped }, ""},
		{"never seen on the dashboard", func(o *observed) { o.job.Status.JobStatus = rayv1.JobStatusNew }, ""},
		{"its cluster gone", func(o *observed) { o.cluster = nil }, ""},
		{"its cluster going", func(o *observed) { o.cluster.DeletionTimestamp = &metav1.Time{Time: t0} }, ""},
		{"the window over", func(o *observed) { o.now = t0.Add(stopRetryWindow) }, ""},
		{"complete", func(o *observed) { o.job.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusComplete }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusFailed)
			j.Status.DashboardURL, j.Status.JobStatus, j.Status.Reason = "rj-fghij-head-svc.ns.svc.cluster.local:8265", rayv1.JobStatusRunning, rayv1.DeadlineExceeded
			j.Status.EndTime = &metav1.Time{Time: t0.Add(-time.Minute)}
			o := observed{job: j, cluster: readyCluster(), now: t0}
			tc.edit(&o)
			if d := decide(o); d.stopJob != tc.want {
				t.Fatalf("stopJob %q, want %q", d.stopJob, tc.want)
			}
		})
	}
}

// The attempt records the cluster it runs on before anything is submitted
// to it, and a cluster of its name created since (another UID) is not
// taken for it: the attempt ends, saying the cluster was created again,
// and a submitter still running is deleted, so that nothing is submitted
// to the new cluster.
func TestAnAttemptIsBoundToItsCluster(t *testing.T) {
	rc := readyCluster()
	rc.UID = "uid-1"
	o := observed{job: baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusInitializing), cluster: rc, headURL: "rj-fghij-head-svc.ns.svc.cluster.local:8265", now: t0}
	if d := decide(o); d.bindCluster != "uid-1" || d.status.JobDeploymentStatus != rayv1.JobDeploymentStatusRunning {
		t.Fatalf("initializing: bind %q, status %q, want uid-1 recorded as it runs", d.bindCluster, d.status.JobDeploymentStatus)
	}
	o.job.Annotations = map[string]string{AnnotationClusterUID: "uid-1"}
	if d := decide(o); d.bindCluster != "" {
		t.Fatalf("initializing: bind %q again", d.bindCluster)
	}

	j := baseJob(rayv1.HTTPMode, rayv1.JobDeploymentStatusRunning)
	j.Spec.ClusterSelector = map[string]string{"ray.io/cluster": "rj-fghij"}
	j.Annotations = map[string]string{AnnotationClusterUID: "uid-1"}
	again := readyCluster()
	again.UID = "uid-2"
	for _, jds := range []rayv1.JobDeploymentStatus{rayv1.JobDeploymentStatusRunning, rayv1.JobDeploymentStatusWaiting, rayv1.JobDeploymentStatusFailed} {
		j.Status.JobDeploymentStatus = jds
		if !replaced(j, again) || replaced(j, rc) {
			t.Fatalf("%s: a cluster created again is not told from the attempt's", jds)
		}
	}
	j.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusInitializing
	if replaced(j, again) {
		t.Fatal("initializing: the cluster there is, is taken")
	}
	j.Status.JobDeploymentStatus = rayv1.JobDeploymentStatusRunning
	d := decide(observed{job: j, replacedBy: "uid-2", submitter: &batchv1.Job{}, dash: info(rayv1.JobStatusRunning, ""), now: t0})
	st := d.status
	if st.JobDeploymentStatus != rayv1.JobDeploymentStatusFailed || st.JobStatus != rayv1.JobStatusFailed || d.submit || !d.deleteSubmitter ||
		st.Message != "RayCluster rj-fghij (picked by the clusterSelector) was deleted and created again (UID uid-1, now uid-2) while the RayJob ran on it: Ray job rj-abcde is lost with it" {
		t.Fatalf("replaced: %+v, submit %v, deleteSubmitter %v", st, d.submit, d.deleteSubmitter)
	}
}
