package rayjob

import (
	"math"
	"strings"
	"testing"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func cond(t string, s metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg}
}

// The RayJob reads its cluster's verdict from the conditions Loom's
// raycluster controller writes: never fits first, then a held gang (not
// Volcano missing under auto, which runs without a gang), then Stalled.
func TestClusterVerdict(t *testing.T) {
	f, tr := metav1.ConditionFalse, metav1.ConditionTrue
	neverFits := cond(clusterConditionGPUs, f, "NeverFits", "group gpu: needs 1 pod × 16 nvidia.com/gpu, none with more than 8")
	cases := []struct {
		name   string
		conds  []metav1.Condition
		reason rayv1.JobFailedReason
		msg    string
	}{
		{"nothing said", nil, "", ""},
		{"fits", []metav1.Condition{cond(clusterConditionGPUs, tr, "Fits", "ok"), cond(clusterConditionGang, tr, "PodGroupCreated", "pg")}, "", ""},
		{"never fits", []metav1.Condition{neverFits}, ReasonClusterNeverFits, "RayCluster rj-fghij can never fit: group gpu: needs 1 pod × 16 nvidia.com/gpu, none with more than 8"},
		{"never fits comes before the gang", []metav1.Condition{cond(clusterConditionGang, f, "QueueNotFound", "q"), neverFits}, ReasonClusterNeverFits, "can never fit"},
		{"queue missing", []metav1.Condition{cond(clusterConditionGang, f, "QueueNotFound", `PodGroup ray-rj-fghij-pg: Volcano queue "research" does not exist`)},
			ReasonClusterGangHeld, `RayCluster rj-fghij's gang is held (QueueNotFound): PodGroup ray-rj-fghij-pg: Volcano queue "research" does not exist`},
		{"Volcano unschedulable", []metav1.Condition{cond(clusterConditionGang, f, "NotEnoughResources", "Volcano holds PodGroup x (Inqueue): 3/4 tasks")},
			ReasonClusterGangHeld, "(NotEnoughResources): Volcano holds PodGroup x"},
		{"Volcano missing under auto runs without a gang", []metav1.Condition{cond(clusterConditionGang, f, "VolcanoNotInstalled", "gang scheduling off"),
			cond(clusterConditionStalled, f, "HeadPodNotFound", "nothing in the way")}, "", ""},
		{"Volcano missing under volcano holds it", []metav1.Condition{cond(clusterConditionGang, f, "VolcanoNotInstalled", "no pods are created"),
			cond(clusterConditionStalled, tr, "VolcanoNotInstalled", "no pods are created")}, ReasonClusterGangHeld, "(VolcanoNotInstalled): no pods are created"},
		{"stalled on its spec", []metav1.Condition{cond(clusterConditionStalled, tr, "TooManyPods", "asks 900 pods")},
			ReasonClusterStalled, "RayCluster rj-fghij is stalled (TooManyPods): asks 900 pods"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := readyCluster()
			rc.Status.Conditions = tc.conds
			reason, msg := clusterVerdict(rc)
			if reason != tc.reason || !strings.Contains(msg, tc.msg) || (tc.reason == "") != (msg == "") {
				t.Fatalf("verdict %q %q, want %q containing %q", reason, msg, tc.reason, tc.msg)
			}
		})
	}
}

// A verdict keeps an initializing RayJob from submitting, even on a
// cluster that reads ready; it is a Warning event once, and goes with
// the cluster's verdict.
func TestDecideHeldByCluster(t *testing.T) {
	neverFits := cond(clusterConditionGPUs, metav1.ConditionFalse, "NeverFits", "group gpu: a pod is bigger than any node it may go to, it can never fit")
	for _, mode := range []rayv1.JobSubmissionMode{rayv1.K8sJobMode, rayv1.HTTPMode, rayv1.InteractiveMode} {
		o := observed{job: baseJob(mode, rayv1.JobDeploymentStatusInitializing), cluster: readyCluster(),
			headURL: "rj-fghij-head-svc.ns.svc.cluster.local:8265", now: t0}
		o.cluster.Status.Conditions = []metav1.Condition{neverFits}
		d := decide(o)
		st := d.status
		if st.JobDeploymentStatus != rayv1.JobDeploymentStatusInitializing || st.Reason != ReasonClusterNeverFits ||
			!strings.HasPrefix(st.Message, "RayCluster rj-fghij can never fit: group gpu") {
			t.Fatalf("%s: status %q reason %q message %q", mode, st.JobDeploymentStatus, st.Reason, st.Message)
		}
		if d.createSubmitter || d.submit || st.DashboardURL != "" {
			t.Fatalf("%s: a cluster that can never fit got a submission: %+v", mode, d)
		}
		if d.warn.reason != string(ReasonClusterNeverFits) || d.warn.msg != st.Message {
			t.Fatalf("%s: warning %+v", mode, d.warn)
		}
		// Said already: no second event.
		o.job.Status = st
		if d := decide(o); d.warn.reason != "" || d.status.Reason != ReasonClusterNeverFits {
			t.Fatalf("%s: again: warning %+v reason %q", mode, d.warn, d.status.Reason)
		}
		// The verdict gone, the job goes on and the reason with it.
		o.cluster.Status.Conditions = []metav1.Condition{cond(clusterConditionGPUs, metav1.ConditionTrue, "Fits", "fits")}
		d = decide(o)
		if d.status.Reason != "" || d.status.JobDeploymentStatus == rayv1.JobDeploymentStatusInitializing {
			t.Fatalf("%s: after the verdict went: %q reason %q message %q", mode, d.status.JobDeploymentStatus, d.status.Reason, d.status.Message)
		}
	}
	// A suspension or the deadline still wins over the cluster's verdict.
	o := observed{job: baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusInitializing), cluster: readyCluster(), now: t0}
	o.cluster.Status.Conditions = []metav1.Condition{neverFits}
	o.job.Spec.Suspend = true
	if st := decide(o).status; st.JobDeploymentStatus != rayv1.JobDeploymentStatusSuspending || st.Reason != "" {
		t.Fatalf("suspended: %q reason %q", st.JobDeploymentStatus, st.Reason)
	}
}

// While its cluster comes up, an initializing RayJob says what holds the
// cluster, naming it and the condition's reason: Loom's Ready (the pods on
// their way, a pod create refused), never the ReplicaFailure of an
// optional child (the serve Service's name taken), which holds neither
// the cluster nor the job; of a cluster another operator runs (KubeRay),
// its ReplicaFailure, HeadPodReady or RayClusterProvisioned.
func TestWaitingForTheClusterSaysWhatHoldsIt(t *testing.T) {
	f, tr := metav1.ConditionFalse, metav1.ConditionTrue
	serveTaken := cond(string(rayv1.RayClusterReplicaFailure), tr, "NameConflict", "Service ns/rj-fghij-serve-svc is controlled by Deployment web (uid 1): rename the RayCluster or that object")
	cases := []struct {
		name  string
		conds []metav1.Condition
		want  string
		not   string
	}{
		{"nothing said", nil, "waiting for RayCluster rj-fghij to be ready", "("},
		{"Loom's: an optional child's name taken is not the job's", []metav1.Condition{serveTaken,
			cond(clusterConditionReady, f, "HeadPodNotReady", "head pod rj-fghij-head-x is Pending and not ready")},
			"waiting for RayCluster rj-fghij to be ready (HeadPodNotReady): head pod rj-fghij-head-x is Pending and not ready", "serve-svc"},
		{"Loom's: a pod create refused", []metav1.Condition{
			cond(string(rayv1.RayClusterReplicaFailure), tr, "FailedToApply", `pods "rj-fghij-head-x" is forbidden: exceeded quota`),
			cond(clusterConditionReady, f, "FailedToApply", `pods "rj-fghij-head-x" is forbidden: exceeded quota`)},
			`waiting for RayCluster rj-fghij to be ready (FailedToApply): pods "rj-fghij-head-x" is forbidden: exceeded quota`, ""},
		{"KubeRay's: a pod create refused", []metav1.Condition{
			cond(string(rayv1.HeadPodReady), f, "HeadPodNotFound", "no head pod"),
			cond(string(rayv1.RayClusterReplicaFailure), tr, "FailedCreateHeadPod", "exceeded quota")},
			"waiting for RayCluster rj-fghij to be ready (ReplicaFailure, FailedCreateHeadPod): exceeded quota", ""},
		{"KubeRay's: the head not ready", []metav1.Condition{cond(string(rayv1.HeadPodReady), f, "HeadPodNotFound", "no head pod")},
			"waiting for RayCluster rj-fghij to be ready (HeadPodReady, HeadPodNotFound): no head pod", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := observed{job: baseJob(rayv1.K8sJobMode, rayv1.JobDeploymentStatusInitializing), cluster: readyCluster(), now: t0}
			o.cluster.Status.State = ""
			o.cluster.Status.Conditions = tc.conds
			st := decide(o).status
			if st.JobDeploymentStatus != rayv1.JobDeploymentStatusInitializing || st.Message != tc.want || (tc.not != "" && strings.Contains(st.Message, tc.not)) {
				t.Fatalf("status %q %q, want %q", st.JobDeploymentStatus, st.Message, tc.want)
			}
		})
	}
}

// backoffLimit counts retries after the first attempt; MaxInt32 is as good
// as unlimited, not an overflow to no retry at all.
func TestCountAndRetry(t *testing.T) {
	for _, tt := range []struct {
		limit  *int32
		failed int32 // failures before this one
		want   rayv1.JobDeploymentStatus
	}{
		{nil, 0, rayv1.JobDeploymentStatusFailed},
		{ptr.To[int32](0), 0, rayv1.JobDeploymentStatusFailed},
		{ptr.To[int32](2), 0, rayv1.JobDeploymentStatusRetrying},
		{ptr.To[int32](2), 1, rayv1.JobDeploymentStatusRetrying},
		{ptr.To[int32](2), 2, rayv1.JobDeploymentStatusFailed},
		{ptr.To[int32](math.MaxInt32), 5, rayv1.JobDeploymentStatusRetrying},
	} {
		j := &rayv1.RayJob{Spec: rayv1.RayJobSpec{BackoffLimit: tt.limit}}
		st := &rayv1.RayJobStatus{JobDeploymentStatus: rayv1.JobDeploymentStatusFailed, Failed: ptr.To(tt.failed)}
		countAndRetry(j, st)
		if st.JobDeploymentStatus != tt.want || *st.Failed != tt.failed+1 {
			t.Errorf("limit %v, %d failed before: %s, failed %d", ptr.Deref(tt.limit, -1), tt.failed, st.JobDeploymentStatus, *st.Failed)
		}
	}
}
