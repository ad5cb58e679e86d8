package why

import (
	"strings"
	"testing"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
)

func c(t, s, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: metav1.ConditionStatus(s), Reason: reason, Message: msg}
}

func job(state trainingv1alpha1.JobState, conds ...metav1.Condition) *trainingv1alpha1.TrainingJob {
	tj := &trainingv1alpha1.TrainingJob{ObjectMeta: metav1.ObjectMeta{Name: "bert", Namespace: "ml", Generation: 1}}
	tj.Spec.ReplicaSpecs.Master.Template.Spec = corev1.PodSpec{
		NodeSelector: map[string]string{gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3"},
		Containers: []corev1.Container{{Name: "m", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("16")}}}},
	}
	tj.Status.State, tj.Status.Conditions, tj.Status.ObservedGeneration = state, conds, 1
	return tj
}

// withNICs adds to the master's container 32 of each of the network
// operator's nvidia.com/ resources.
func withNICs(tj *trainingv1alpha1.TrainingJob) *trainingv1alpha1.TrainingJob {
	l := &tj.Spec.ReplicaSpecs.Master.Template.Spec.Containers[0].Resources.Limits
	*l = plus(*l, nics(32))
	return tj
}

func TestTrainingJob(t *testing.T) {
	cases := []struct {
		name                string
		tj                  *trainingv1alpha1.TrainingJob
		line, advice, notIn string
	}{
		{"no status", job(""), "trainingjob/bert: Unknown (NoStatus): no conditions yet: the training reconciler has not written a status", "--controllers include training", ""},
		{"never fits", job(trainingv1alpha1.StatePending,
			c("Created", "True", "Created", "created"),
			c("Scheduled", "False", ReasonNeverFits, "0 of 1 pods placed; inventory: needs 1 pod × 16 nvidia.com/gpu;\n it can never fit"),
			c("Running", "False", ReasonWaitingForPods, "0 of 1 pods run"),
			c("Ready", "False", ReasonNeverFits, "same")),
			"trainingjob/bert: Pending (NeverFits): 0 of 1 pods placed; inventory: needs 1 pod × 16 nvidia.com/gpu; it can never fit",
			"reduce replicas or GPUs per pod (now 16 nvidia.com/gpu), or add nodes with NVIDIA-H100-80GB-HBM3 GPUs", ""},
		{"never fits, a NIC beside", withNICs(job(trainingv1alpha1.StatePending,
			c("Scheduled", "False", ReasonNeverFits, "it can never fit"))),
			"trainingjob/bert: Pending (NeverFits): it can never fit",
			"reduce replicas or GPUs per pod (now 16 nvidia.com/gpu)", "rdma"},
		{"bigger than the cluster", job(trainingv1alpha1.StatePending,
			c("Scheduled", "False", ReasonNotEnoughGPUs, "2 of 8 pods placed; inventory: needs 32 more GPUs than the cluster has (32 on 4 nodes)")),
			"trainingjob/bert: Pending (NotEnoughGPUs): 2 of 8 pods placed; inventory: needs 32 more GPUs than the cluster has (32 on 4 nodes)",
			"add GPU nodes", "wait for GPUs"},
		{"waits for GPUs", job(trainingv1alpha1.StatePending,
			c("Scheduled", "False", ReasonNotEnoughGPUs, "0 of 4 pods placed; inventory: needs 4 pods × 8 nvidia.com/gpu (32 in all): it fits the cluster once GPUs free up")),
			"trainingjob/bert: Pending (NotEnoughGPUs): 0 of 4 pods placed; inventory: needs 4 pods × 8 nvidia.com/gpu (32 in all): it fits the cluster once GPUs free up",
			"wait for GPUs to free up", "add GPU nodes"},
		{"queue", job(trainingv1alpha1.StatePending, c("Scheduled", "False", ReasonQueueNotFound, `Volcano queue "default" does not exist`)),
			`trainingjob/bert: Pending (QueueNotFound): Volcano queue "default" does not exist`, `create the Volcano queue "default"`, ""},
		{"not created beats scheduled", job(trainingv1alpha1.StateHeld,
			c("Created", "False", ReasonVolcanoNotInstalled, "Volcano is not installed"),
			c("Scheduled", "False", ReasonPodsPending, "not yet")),
			"trainingjob/bert: Held (VolcanoNotInstalled): Volcano is not installed", "spec.gang.scheduler: none", ""},
		{"failed beats everything", job(trainingv1alpha1.StateFailed,
			c("Failed", "True", ReasonBackoffLimit, "exit 1; restarted 3 times"),
			c("Scheduled", "False", ReasonPodsPending, "x")),
			"trainingjob/bert: Failed (BackoffLimitExceeded): exit 1; restarted 3 times", "backoffLimit", ""},
		{"invalid spec", job(trainingv1alpha1.StateHeld,
			c("Created", "False", ReasonInvalidSpec, "no pod can carry the template's metadata"), c("Ready", "False", ReasonInvalidSpec, "same")),
			"trainingjob/bert: Held (InvalidSpec): no pod can carry the template's metadata", "kubectl edit trainingjob -n ml bert", ""},
		{"queued in Kueue", job(trainingv1alpha1.StateSuspended,
			c("Suspended", "True", ReasonQueuedInKueue, "waiting for quota")),
			"trainingjob/bert: Suspended (QueuedInKueue): waiting for quota", "once Kueue admits its Workload", ""},
		{"evicted by Kueue", job(trainingv1alpha1.StateSuspended,
			c("Suspended", "True", ReasonEvictedByKueue, "suspended by Kueue: preempted")),
			"trainingjob/bert: Suspended (EvictedByKueue): suspended by Kueue: preempted", "resumes by itself", ""},
		{"running", job(trainingv1alpha1.StateRunning,
			c("Scheduled", "True", "GangScheduled", "placed"), c("Running", "True", "PodsRunning", "all 2 pods run"), c("Ready", "True", "PodsRunning", "all 2 pods run")),
			"trainingjob/bert: Running (PodsRunning): all 2 pods run", "", "What to do"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := TrainingJob(tc.tj, smallNames)
			if got := a.Line(); got != tc.line {
				t.Errorf("line\n got %q\nwant %q", got, tc.line)
			}
			if !strings.Contains(a.Advice, tc.advice) {
				t.Errorf("advice %q lacks %q", a.Advice, tc.advice)
			}
			if tc.advice == "" && a.Advice != "" {
				t.Errorf("advice %q, want none", a.Advice)
			}
			if tc.notIn != "" && strings.Contains(a.Advice, tc.notIn) {
				t.Errorf("advice %q has %q", a.Advice, tc.notIn)
			}
		})
	}
}

func TestTrainingJobStale(t *testing.T) {
	tj := job(trainingv1alpha1.StatePending, c("Scheduled", "False", ReasonPodsPending, "x"))
	tj.Generation = 3
	if a := TrainingJob(tj, sharing.Names{}); len(a.Also) != 1 || !strings.Contains(a.Also[0], "generation 1, the spec is at 3") {
		t.Errorf("also = %q", a.Also)
	}
}

func TestClusterPolicy(t *testing.T) {
	cp := func(conds ...metav1.Condition) *gpuv1alpha1.ClusterPolicy {
		p := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
		p.Status.State, p.Status.Conditions = gpuv1alpha1.PolicyNotReady, conds
		p.Status.Components = []gpuv1alpha1.ComponentStatus{{Name: "driver", Enabled: true, State: "notReady", Desired: 4, Ready: 3, Message: "1 pod crashing"},
			{Name: "dcgm", Enabled: true, State: "ready"}}
		return p
	}
	cases := []struct {
		name       string
		p          *gpuv1alpha1.ClusterPolicy
		line, adv  string
		alsoPrefix string
	}{
		{"paused", cp(c("Ready", "False", gpuv1alpha1.ReasonUpgradePaused, "driver upgrade paused: 2 nodes failed"),
			c(gpuv1alpha1.ConditionDriverUpgrade, "False", gpuv1alpha1.ReasonUpgradePaused, "2 nodes failed")),
			"clusterpolicy/default: notReady (UpgradePaused): driver upgrade paused: 2 nodes failed",
			"kubectl annotate clusterpolicy default gpu.loom.dev/driver-upgrade-resume=true", "component driver notReady (3 of 4 nodes ready): 1 pod crashing"},
		{"components", cp(c("Ready", "False", ReasonComponentsWait, "1 of 2 components not ready: driver (1 pod crashing)"),
			c(gpuv1alpha1.ConditionDriverUpgrade, "False", gpuv1alpha1.ReasonUpgradeInProgress, "1 node upgrading")),
			"clusterpolicy/default: notReady (ComponentsNotReady): 1 of 2 components not ready: driver (1 pod crashing)",
			"kubectl get pods -A -l gpu.loom.dev/clusterpolicy=default", "driver upgrade (UpgradeInProgress): 1 node upgrading"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := ClusterPolicy(tc.p)
			if a.Line() != tc.line {
				t.Errorf("line\n got %q\nwant %q", a.Line(), tc.line)
			}
			if !strings.Contains(a.Advice, tc.adv) {
				t.Errorf("advice %q lacks %q", a.Advice, tc.adv)
			}
			if len(a.Also) == 0 || a.Also[0] != tc.alsoPrefix {
				t.Errorf("also = %q, want first %q", a.Also, tc.alsoPrefix)
			}
		})
	}
	ready := cp(c("Ready", "True", "AllComponentsReady", "8 components ready on 4 GPU nodes"),
		c(gpuv1alpha1.ConditionDriverUpgrade, "False", gpuv1alpha1.ReasonUpgradeInProgress, "2 of 4 nodes upgrading"))
	ready.Status.State, ready.Status.Components = gpuv1alpha1.PolicyReady, nil
	if got, want := ClusterPolicy(ready).Line(), "clusterpolicy/default: ready (UpgradeInProgress): driver upgrade: 2 of 4 nodes upgrading"; got != want {
		t.Errorf("ready policy mid-upgrade: got %q, want %q", got, want)
	}
}

func TestRayCluster(t *testing.T) {
	rc := &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "ml", Labels: map[string]string{RayLabelQueue: "q1"}}}
	rc.Status.Conditions = []metav1.Condition{
		c(string(rayv1.HeadPodReady), "False", string(rayv1.HeadPodNotFound), "no head pod yet"),
		c(RayConditionGang, "False", ReasonQueueNotFound, `PodGroup r: Volcano queue "q1" does not exist`),
		c(RayConditionGPUs, "True", "Fits", "fits"),
	}
	a := RayCluster(rc)
	if want := `raycluster/r: Unknown (QueueNotFound): PodGroup r: Volcano queue "q1" does not exist`; a.Line() != want {
		t.Errorf("got %q, want %q", a.Line(), want)
	}
	if !strings.Contains(a.Advice, `create the Volcano queue "q1"`) {
		t.Errorf("advice %q", a.Advice)
	}
	rc.Status.Conditions[2] = c(RayConditionGPUs, "False", ReasonNeverFits, "group gpu: needs 9 nvidia.com/gpu")
	if a := RayCluster(rc); a.Reason != ReasonNeverFits {
		t.Errorf("NeverFits should come before the gang: got %q", a.Reason)
	}
}

func TestRayJob(t *testing.T) {
	rj := func(dep rayv1.JobDeploymentStatus, job rayv1.JobStatus, reason rayv1.JobFailedReason, msg string) *rayv1.RayJob {
		j := &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "tune", Namespace: "ml", Generation: 1}}
		j.Status = rayv1.RayJobStatus{JobDeploymentStatus: dep, JobStatus: job, Reason: reason, Message: msg, RayClusterName: "tune-x7k2p", ObservedGeneration: 1}
		return j
	}
	cases := []struct {
		name         string
		job          *rayv1.RayJob
		line, advice string
	}{
		{"no status", rj("", "", "", ""), "rayjob/tune: Unknown (NoStatus): no status yet: the rayjob reconciler has not written one", "--controllers include rayjob"},
		{"cluster never fits", rj(rayv1.JobDeploymentStatusInitializing, "", ReasonRayClusterNeverFits, "RayCluster tune-x7k2p: group gpu needs 16 nvidia.com/gpu per pod"),
			"rayjob/tune: Initializing (RayClusterNeverFits): RayCluster tune-x7k2p: group gpu needs 16 nvidia.com/gpu per pod",
			"kubectl loom why raycluster/tune-x7k2p -n ml"},
		{"app failed", rj(rayv1.JobDeploymentStatusFailed, rayv1.JobStatusFailed, rayv1.AppFailed, "exit 1"),
			"rayjob/tune: Failed (AppFailed): exit 1", "kubectl logs -n ml job/tune"},
		{"running, no message", rj(rayv1.JobDeploymentStatusRunning, rayv1.JobStatusRunning, "", ""),
			"rayjob/tune: Running: Ray job status RUNNING on RayCluster tune-x7k2p", ""},
		{"suspended", rj(rayv1.JobDeploymentStatusSuspended, "", "", ""),
			"rayjob/tune: Suspended: not submitted yet on RayCluster tune-x7k2p", `"suspend":false`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := RayJob(tc.job)
			if got := a.Line(); got != tc.line {
				t.Errorf("line\n got %q\nwant %q", got, tc.line)
			}
			if !strings.Contains(a.Advice, tc.advice) || (tc.advice == "" && a.Advice != "") {
				t.Errorf("advice %q, want it to hold %q", a.Advice, tc.advice)
			}
		})
	}
}

// The live picture a waiting job's status leaves out: computed from the
// nodes and bound pods as the manager's inventory does.
func TestTrainingJobGPUsNow(t *testing.T) {
	tj := job(trainingv1alpha1.StatePending, c("Scheduled", "False", ReasonNotEnoughGPUs, "waits"))
	tj.Spec.ReplicaSpecs.Master.Template.Spec.NodeSelector = nil // 1 pod × 16
	h := map[string]string{gpuv1alpha1.LabelProduct: "NVIDIA-H100-80GB-HBM3"}
	nodes := []corev1.Node{gpuNode("g0", h, nil, gpus(8)), gpuNode("g1", h, nil, gpus(16)), gpuNode("g2", h, nil, gpus(16))}
	nodes[2].Spec.Unschedulable = true
	pod := func(name, node string, n int64, phase corev1.PodPhase) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", UID: types.UID(name)},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(n, resource.DecimalSI)}}}}},
			Status: corev1.PodStatus{Phase: phase}}
	}
	pods := []corev1.Pod{pod("a", "g1", 4, corev1.PodRunning), pod("b", "g0", 8, corev1.PodSucceeded)}
	want := "GPUs now: nvidia.com/gpu: 20 free on 2 nodes, 24 in the cluster; 1 node has 12 free, 1 has 8; 16 more on 1 cordoned node"
	if got := TrainingJobGPUsNow(tj, sharing.Source{}, nodes, nil, pods); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if !WaitsToBeScheduled(tj) {
		t.Error("a job not scheduled does not wait")
	}
	tj.Status.Conditions = []metav1.Condition{c("Scheduled", "True", "GangScheduled", "placed")}
	if WaitsToBeScheduled(tj) {
		t.Error("a scheduled job waits")
	}
	if got := TrainingJobGPUsNow(tj, sharing.Source{}, nil, nil, nil); got != "" {
		t.Errorf("no GPU nodes: %q", got)
	}

	// A job asking for the resource the sharing config renames, beside a
	// NIC: the picture is of the renamed GPUs, as the manager's.
	small := withNICs(job(trainingv1alpha1.StatePending, c("Scheduled", "False", ReasonNotEnoughGPUs, "waits")))
	small.Spec.ReplicaSpecs.Master.Template.Spec.NodeSelector = nil
	small.Spec.ReplicaSpecs.Master.Template.Spec.Containers[0].Resources.Limits = plus(nics(1), corev1.ResourceList{"nvidia.com/small": resource.MustParse("8")})
	nodes = []corev1.Node{gpuNode("s0", h, nil, plus(nics(2), corev1.ResourceList{"nvidia.com/small": resource.MustParse("4")}))}
	want = "GPUs now: nvidia.com/small: 4 free on 1 node, 4 in the cluster; 1 node has 4 free"
	if got := TrainingJobGPUsNow(small, smallSource, nodes, nil, nil); got != want {
		t.Errorf("renamed shared GPUs\n got  %q\nwant %q", got, want)
	}
}
