package kueue

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Workload asks for the job's pod sets only while the names, counts and
// every container's requests and limits agree; a request defaulted from
// its limit (the API server's and Kueue's webhook's defaulting) or spelt
// otherwise is the same request.
func TestSamePodSets(t *testing.T) {
	list := func(kv ...string) corev1.ResourceList {
		out := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	set := func(name string, count int32, req, lim corev1.ResourceList, init ...corev1.Container) PodSet {
		return PodSet{Name: name, Count: count, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			InitContainers: init,
			Containers:     []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}}},
		}}}
	}
	job := []PodSet{set("master", 1, list("cpu", "1"), list("nvidia.com/gpu", "8")), set("worker", 2, list("cpu", "1"), list("nvidia.com/gpu", "8"))}
	tests := []struct {
		name string
		have []PodSet
		same bool
	}{
		{"as built", job, true},
		{"requests defaulted from limits", []PodSet{set("master", 1, list("cpu", "1", "nvidia.com/gpu", "8"), list("nvidia.com/gpu", "8")), set("worker", 2, list("cpu", "1000m", "nvidia.com/gpu", "8"), list("nvidia.com/gpu", "8"))}, true},
		{"another count", []PodSet{job[0], set("worker", 3, list("cpu", "1"), list("nvidia.com/gpu", "8"))}, false},
		{"more GPUs", []PodSet{job[0], set("worker", 2, list("cpu", "1"), list("nvidia.com/gpu", "16"))}, false},
		{"another request", []PodSet{job[0], set("worker", 2, list("cpu", "2"), list("nvidia.com/gpu", "8"))}, false},
		{"an init container more", []PodSet{job[0], set("worker", 2, list("cpu", "1"), list("nvidia.com/gpu", "8"), corev1.Container{Name: "fetch"})}, false},
		{"a pod set less", job[:1], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &Workload{Spec: WorkloadSpec{PodSets: tt.have}}
			if got := w.SamePodSets(job); got != tt.same {
				t.Fatalf("SamePodSets = %v, want %v", got, tt.same)
			}
		})
	}
}

// PodsReady follows the admitted gang as jobframework's
// generatePodsReadyCondition writes it for Kueue's own jobs (Kueue's
// waitForPodsReady evicts an admitted Workload whose PodsReady is not True
// in time), with no write where the condition says so already or where
// only WaitForStart would replace a missing one.
func TestPodsReadyStatus(t *testing.T) {
	now := time.Now()
	cond := func(ty string, s metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: ty, Status: s, Reason: reason, LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))}
	}
	admitted := func(extra ...metav1.Condition) *Workload {
		w := &Workload{Status: WorkloadStatus{Admission: &Admission{ClusterQueue: "cq"},
			Conditions: []metav1.Condition{cond(CondQuotaReserved, metav1.ConditionTrue, "QuotaReserved"), cond(CondAdmitted, metav1.ConditionTrue, "Admitted")}}}
		w.Status.Conditions = append(w.Status.Conditions, extra...)
		return w
	}
	queued := func(extra ...metav1.Condition) *Workload {
		return &Workload{Status: WorkloadStatus{Conditions: append([]metav1.Condition{cond(CondQuotaReserved, metav1.ConditionFalse, "Pending")}, extra...)}}
	}
	tests := []struct {
		name       string
		wl         *Workload
		ready      bool
		want       metav1.ConditionStatus // "" for no patch
		wantReason string
	}{
		{"admitted, gang ready", admitted(), true, metav1.ConditionTrue, reasonStarted},
		{"admitted, gang ready, said already", admitted(cond(CondPodsReady, metav1.ConditionTrue, reasonStarted)), true, "", ""},
		{"admitted, gang starting, no condition", admitted(), false, "", ""},
		{"admitted, ready gang broke", admitted(cond(CondPodsReady, metav1.ConditionTrue, reasonStarted)), false, metav1.ConditionFalse, reasonWaitForRecovery},
		{"admitted, recovering, said already", admitted(cond(CondPodsReady, metav1.ConditionFalse, reasonWaitForRecovery)), false, "", ""},
		{"admitted, recovered", admitted(cond(CondPodsReady, metav1.ConditionFalse, reasonWaitForRecovery)), true, metav1.ConditionTrue, reasonRecovered},
		{"admitted anew, last admission's readiness", admitted(cond(CondPodsReady, metav1.ConditionFalse, reasonWaitForStart)), false, "", ""},
		{"not admitted, last admission's gang was ready", queued(cond(CondPodsReady, metav1.ConditionTrue, reasonStarted)), false, metav1.ConditionFalse, reasonWaitForStart},
		{"not admitted, no condition", queued(), false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			patch := PodsReadyStatus(tt.wl, tt.ready, now)
			if tt.want == "" {
				if patch != nil {
					t.Fatalf("patch %v, want none", patch)
				}
				return
			}
			if patch == nil {
				t.Fatalf("no patch, want PodsReady %s %s", tt.want, tt.wantReason)
			}
			conds := patch["status"].(map[string]any)["conditions"].([]metav1.Condition)
			c := meta.FindStatusCondition(conds, CondPodsReady)
			if c == nil || c.Status != tt.want || c.Reason != tt.wantReason {
				t.Fatalf("PodsReady = %+v, want %s %s", c, tt.want, tt.wantReason)
			}
			if len(conds) != len(tt.wl.Status.Conditions)+btoi(tt.wl.Cond(CondPodsReady) == nil) {
				t.Fatalf("the patch drops Kueue's conditions: %+v", conds)
			}
		})
	}
}

// A released Workload's readiness is reset, so that Kueue's waitForPodsReady
// times the next admission's gang.
func TestReleaseStatusResetsPodsReady(t *testing.T) {
	w := &Workload{Status: WorkloadStatus{Admission: &Admission{ClusterQueue: "cq"}, Conditions: []metav1.Condition{
		{Type: CondQuotaReserved, Status: metav1.ConditionTrue, Reason: "QuotaReserved"},
		{Type: CondAdmitted, Status: metav1.ConditionTrue, Reason: "Admitted"},
		{Type: CondEvicted, Status: metav1.ConditionTrue, Reason: reasonPreempted},
		{Type: CondPodsReady, Status: metav1.ConditionTrue, Reason: reasonStarted},
	}}}
	conds := ReleaseStatus(w, "the job was stopped", time.Now())["status"].(map[string]any)["conditions"].([]metav1.Condition)
	if c := meta.FindStatusCondition(conds, CondPodsReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != reasonWaitForStart {
		t.Fatalf("PodsReady after the release = %+v, want False %s", c, reasonWaitForStart)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// An admission check's podSetUpdates reach the pods of their pod set, as
// jobframework merges them (a ProvisioningRequest check's annotations let
// the pods consume the capacity it booked); the flavours' and the pod's
// own values win a conflict, Loom's labels included.
func TestPlacementAddsAdmissionCheckUpdates(t *testing.T) {
	w := &Workload{Status: WorkloadStatus{AdmissionChecks: []AdmissionCheckState{{
		Name: "prov", State: "Ready",
		PodSetUpdates: []PodSetUpdate{
			{Name: "worker", Annotations: map[string]string{
				"autoscaling.x-k8s.io/consume-provisioning-request": "wl-prov-1",
				"autoscaling.x-k8s.io/provisioning-class-name":      "queued-provisioning.gke.io",
			}, Labels: map[string]string{"team": "theirs", "pool": "booked"}, NodeSelector: map[string]string{"pool": "booked", "gpu": "b200"},
				Tolerations: []corev1.Toleration{{Key: "booked", Operator: corev1.TolerationOpExists}}},
			{Name: "master", Annotations: map[string]string{"only": "master"}},
		},
	}}}}
	flavor := &ResourceFlavor{}
	flavor.Spec.NodeLabels = map[string]string{"gpu": "h100"}
	p := PlacementOf([]string{"h100"}, map[string]*ResourceFlavor{"h100": flavor})
	p.AddUpdates(w, "worker")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "ours"}}}
	p.Apply(&pod.ObjectMeta, &pod.Spec)
	if got := pod.Annotations["autoscaling.x-k8s.io/consume-provisioning-request"]; got != "wl-prov-1" {
		t.Errorf("consume-provisioning-request = %q, want wl-prov-1 (annotations %v)", got, pod.Annotations)
	}
	if _, ok := pod.Annotations["only"]; ok {
		t.Errorf("the master's update reached a worker: %v", pod.Annotations)
	}
	if pod.Labels["team"] != "ours" || pod.Labels["pool"] != "booked" {
		t.Errorf("labels = %v, want the pod's team and the check's pool", pod.Labels)
	}
	if pod.Spec.NodeSelector["gpu"] != "h100" || pod.Spec.NodeSelector["pool"] != "booked" {
		t.Errorf("node selector = %v, want the flavour's gpu and the check's pool", pod.Spec.NodeSelector)
	}
	if len(pod.Spec.Tolerations) != 1 || pod.Spec.Tolerations[0].Key != "booked" {
		t.Errorf("tolerations = %v, want the check's", pod.Spec.Tolerations)
	}
}

// An admission covers a gang only whole: every pod set assigned, none
// with fewer pods than it has.
func TestUncovered(t *testing.T) {
	n := func(v int32) *int32 { return &v }
	reserved := []metav1.Condition{{Type: CondQuotaReserved, Status: metav1.ConditionTrue}}
	sets := []PodSet{{Name: "master", Count: 1}, {Name: "worker", Count: 3}}
	tests := []struct {
		name  string
		conds []metav1.Condition
		as    []PodSetAssignment
		want  string
	}{
		{"whole", reserved, []PodSetAssignment{{Name: "master", Count: n(1)}, {Name: "worker", Count: n(3)}}, ""},
		{"no counts (older Workloads): the pod sets'", reserved, []PodSetAssignment{{Name: "master"}, {Name: "worker"}}, ""},
		{"a partial admission", reserved, []PodSetAssignment{{Name: "master", Count: n(1)}, {Name: "worker", Count: n(1)}}, "pod set worker: 1 of 3 pods"},
		{"a pod set left out", reserved, []PodSetAssignment{{Name: "master", Count: n(1)}}, "pod set worker not assigned"},
		{"no quota, nothing to cover", nil, []PodSetAssignment{{Name: "master", Count: n(1)}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &Workload{Spec: WorkloadSpec{PodSets: sets}}
			w.Status.Conditions = tt.conds
			w.Status.Admission = &Admission{ClusterQueue: "cq", PodSetAssignments: tt.as}
			if got := w.Uncovered(); got != tt.want {
				t.Errorf("Uncovered() = %q, want %q", got, tt.want)
			}
		})
	}
}
