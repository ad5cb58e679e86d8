package raycluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/gang"
)

// Suspend deletes every pod (Suspending while any is left, then
// Suspended); resume says so and brings the pods back.
func TestDecideSuspendAndResume(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	rc.Spec.Suspend = ptr.To(true)
	head := buildHeadPod(ctx, rc, "")
	head.Name, head.UID = "h", "uh"
	pg := &schedulingv1beta1.PodGroup{}
	tests := []struct {
		name    string
		suspend bool
		pods    []*corev1.Pod
		state   rayv1.ClusterState
		cond    string // the condition that is True
		remove  int
		create  int
	}{
		{"suspending", true, []*corev1.Pod{head}, "", string(rayv1.RayClusterSuspending), 1, 0},
		{"suspended", true, nil, rayv1.Suspended, string(rayv1.RayClusterSuspended), 0, 0},
		{"resumed", false, nil, "", "", 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc.Spec.Suspend = ptr.To(tt.suspend)
			d := decide(ctx, rc, observed{pods: tt.pods, podGroup: pg, now: now}, "none")
			rc.Status = d.status
			if d.status.State != tt.state || len(d.remove) != tt.remove || len(d.create) != tt.create || !d.removePodGroup {
				t.Fatalf("state %q remove %d create %d removePodGroup %v", d.status.State, len(d.remove), len(d.create), d.removePodGroup)
			}
			for _, c := range []string{string(rayv1.RayClusterSuspending), string(rayv1.RayClusterSuspended)} {
				if got := meta.IsStatusConditionTrue(d.status.Conditions, c); got != (c == tt.cond) {
					t.Fatalf("%s true = %v", c, got)
				}
			}
		})
	}
}

// A ready cluster being suspended keeps state ready until its last pod is
// gone: Kueue's RayCluster integration reads that state as "active" and
// releases the quota only when it changes, so the GPUs are not handed out
// while the pods still hold them.
func TestSuspendingReadyClusterStaysReadyUntilItsPodsAreGone(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	head := buildHeadPod(ctx, rc, "")
	head.Name, head.UID = "h", "uh"
	rc.Status.State = rayv1.Ready
	rc.Spec.Suspend = ptr.To(true)
	d := decide(ctx, rc, observed{pods: []*corev1.Pod{head}, now: time.Now()}, "none")
	if d.status.State != rayv1.Ready || len(d.remove) != 1 || !meta.IsStatusConditionTrue(d.status.Conditions, string(rayv1.RayClusterSuspending)) {
		t.Fatalf("suspending: state %q, %d removed, conditions %+v", d.status.State, len(d.remove), d.status.Conditions)
	}
	rc.Status = d.status
	d = decide(ctx, rc, observed{now: time.Now()}, "none")
	if d.status.State != rayv1.Suspended {
		t.Fatalf("every pod gone: state %q", d.status.State)
	}
}

// A cluster whose spec turned invalid is held, but suspending it (Kueue
// taking its quota back) still deletes its pods: they must not run on
// quota that is no longer the cluster's.
func TestInvalidClusterStillSuspends(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	head := buildHeadPod(ctx, rc, "")
	head.Name, head.UID = "h", "uh"
	head.OwnerReferences = []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: rc.Name, UID: rc.UID, Controller: ptr.To(true)}}
	rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, *rc.Spec.WorkerGroupSpecs[0].DeepCopy()) // duplicate group: invalid
	for _, suspended := range []bool{false, true} {
		rc.Spec.Suspend = ptr.To(suspended)
		d := decide(ctx, rc, observed{pods: []*corev1.Pod{head}, now: time.Now()}, "none")
		if c := meta.FindStatusCondition(d.status.Conditions, ConditionValid); c == nil || c.Status != metav1.ConditionFalse {
			t.Fatalf("suspend %v: Valid condition %+v", suspended, c)
		}
		if len(d.create) != 0 {
			t.Fatalf("suspend %v: an invalid cluster creates %d pods", suspended, len(d.create))
		}
		if want := map[bool]int{false: 0, true: 1}[suspended]; len(d.remove) != want {
			t.Fatalf("suspend %v: %d pods deleted, want %d", suspended, len(d.remove), want)
		}
		if suspended && !meta.IsStatusConditionTrue(d.status.Conditions, string(rayv1.RayClusterSuspending)) {
			t.Fatalf("suspended invalid cluster: conditions %+v", d.status.Conditions)
		}
	}
}

// A scheduler label Loom does not gang through (a typo, another batch
// scheduler) runs the cluster pod by pod and says so; "none" and no label
// say nothing.
func TestUnknownSchedulerIsNamed(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	for _, tt := range []struct{ sched, reason string }{{"yunikorn", "UnknownScheduler"}, {"volcnao", "UnknownScheduler"}, {"none", ""}, {"", ""}} {
		d := decide(ctx, rc, observed{now: time.Now()}, tt.sched)
		c := meta.FindStatusCondition(d.status.Conditions, ConditionGang)
		switch {
		case tt.reason == "" && c != nil:
			t.Errorf("scheduler %q: condition %+v", tt.sched, c)
		case tt.reason != "" && (c == nil || c.Reason != tt.reason || !strings.Contains(c.Message, tt.sched)):
			t.Errorf("scheduler %q: condition %+v", tt.sched, c)
		case len(d.create) == 0:
			t.Errorf("scheduler %q: no pods created", tt.sched)
		case meta.IsStatusConditionTrue(d.status.Conditions, "Stalled"):
			t.Errorf("scheduler %q: stalled", tt.sched)
		}
	}
}

// A cluster that asks for Volcano while it is missing gets no pods and no
// children; once it is there, a PodGroup that its pods join.
func TestDecideVolcano(t *testing.T) {
	ctx := context.Background()
	rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
	rc.UID = "u1"
	d := decide(ctx, rc, observed{now: time.Now()}, "volcano")
	if c := meta.FindStatusCondition(d.status.Conditions, ConditionGang); c == nil || c.Reason != "VolcanoNotInstalled" || len(d.create) != 0 || len(d.children) != 0 || d.podGroup != nil {
		t.Fatalf("without Volcano: gang %+v, create %d children %d", c, len(d.create), len(d.children))
	}
	// Under the manager's auto: no gang, the pods one by one, and a
	// condition saying so.
	d = decide(ctx, rc, observed{autoGang: true, now: time.Now()}, "volcano")
	c := meta.FindStatusCondition(d.status.Conditions, ConditionGang)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "VolcanoNotInstalled" ||
		!strings.Contains(c.Message, "gang scheduling off: Volcano is not installed; pods are scheduled one by one") ||
		len(d.create) != 2 || d.podGroup != nil || !d.removePodGroup {
		t.Fatalf("auto without Volcano: gang %+v, create %d, PodGroup %v", c, len(d.create), d.podGroup)
	}
	for _, p := range d.create {
		if p.Spec.SchedulerName == "volcano" || p.Annotations["scheduling.k8s.io/group-name"] != "" {
			t.Fatalf("pod joins a gang without Volcano: %q %v", p.Spec.SchedulerName, p.Annotations)
		}
	}
	d = decide(ctx, rc, observed{volcano: true, now: time.Now()}, "volcano")
	if d.podGroup == nil || d.podGroup.Name != podGroupName(rc) || d.removePodGroup || len(d.create) != 2 {
		t.Fatalf("with Volcano: PodGroup %v remove %v create %d", d.podGroup, d.removePodGroup, len(d.create))
	}
	for _, p := range d.create {
		if p.Annotations["scheduling.k8s.io/group-name"] != podGroupName(rc) {
			t.Fatalf("pod not in the gang: %v", p.Annotations)
		}
	}
}

// The children: the head Service always, the headless worker Service with
// a multi-host group, the autoscaler's RBAC (its ServiceAccount only when
// the head names none) with the autoscaler.
func TestBuildChildren(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name             string
		mutate           func(*rayv1.RayCluster)
		children, shared int
	}{
		{"plain", func(*rayv1.RayCluster) {}, 1, 0},
		{"multi-host", func(rc *rayv1.RayCluster) { rc.Spec.WorkerGroupSpecs[0].NumOfHosts = 2 }, 2, 0},
		{"autoscaler", func(rc *rayv1.RayCluster) { rc.Spec.EnableInTreeAutoscaling = ptr.To(true) }, 1, 3},
		{"autoscaler, own ServiceAccount", func(rc *rayv1.RayCluster) {
			rc.Spec.EnableInTreeAutoscaling = ptr.To(true)
			rc.Spec.HeadGroupSpec.Template.Spec.ServiceAccountName = "mine"
		}, 1, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
			tt.mutate(rc)
			children, shared, err := buildChildren(ctx, rc)
			if err != nil || len(children) != tt.children || len(shared) != tt.shared {
				t.Fatalf("children %d shared %d: %v", len(children), len(shared), err)
			}
			for _, c := range append(children, shared...) {
				if c.GetObjectKind().GroupVersionKind().Kind == "" {
					t.Fatalf("%s has no kind", c.GetName())
				}
			}
		})
	}
}

// The optional children a cluster does not want are named as the builders
// name them: a cluster that wants them all has none unwanted (a wanted
// child is never deleted), one that wants none has them all, less a
// ServiceAccount a pod template names.
func TestUnwantedChildren(t *testing.T) {
	ctx := context.Background()
	allOn := func(rc *rayv1.RayCluster) {
		rc.Spec.WorkerGroupSpecs[0].NumOfHosts = 2
		rc.Annotations = map[string]string{"ray.io/enable-serve-service": "true"}
		rc.Spec.HeadGroupSpec.EnableIngress = ptr.To(true)
		head := &rc.Spec.HeadGroupSpec.Template.Spec.Containers[0]
		head.Ports = append(head.Ports, corev1.ContainerPort{Name: "serve", ContainerPort: 8000})
		rc.Spec.EnableInTreeAutoscaling = ptr.To(true)
	}
	rbac := []string{"Role raycluster-kuberay", "RoleBinding raycluster-kuberay"}
	sa := "ServiceAccount raycluster-kuberay"
	tests := []struct {
		name   string
		mutate func(*rayv1.RayCluster)
		want   []string
	}{
		{"none", func(*rayv1.RayCluster) {}, append([]string{"Service raycluster-kuberay-headless", "Service raycluster-kuberay-serve-svc",
			"Ingress raycluster-kuberay-head-ingress"}, append(rbac, sa)...)},
		{"all", allOn, nil},
		{"serve annotation false", func(rc *rayv1.RayCluster) {
			allOn(rc)
			rc.Annotations["ray.io/enable-serve-service"] = "false"
		}, []string{"Service raycluster-kuberay-serve-svc"}},
		{"single host", func(rc *rayv1.RayCluster) {
			allOn(rc)
			rc.Spec.WorkerGroupSpecs[0].NumOfHosts = 1
		}, []string{"Service raycluster-kuberay-headless"}},
		{"autoscaler off", func(rc *rayv1.RayCluster) {
			allOn(rc)
			rc.Spec.EnableInTreeAutoscaling = ptr.To(false)
		}, append(slices.Clone(rbac), sa)},
		{"autoscaler off, a worker template names its ServiceAccount", func(rc *rayv1.RayCluster) {
			allOn(rc)
			rc.Spec.EnableInTreeAutoscaling = ptr.To(false)
			rc.Spec.WorkerGroupSpecs[0].Template.Spec.ServiceAccountName = "raycluster-kuberay"
		}, rbac},
		{"autoscaler on, the head names another ServiceAccount", func(rc *rayv1.RayCluster) {
			allOn(rc)
			rc.Spec.HeadGroupSpec.Template.Spec.ServiceAccountName = "mine"
		}, []string{sa}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := normalized(sample(t, "ray-cluster.sample.yaml", "unit"))
			tt.mutate(rc)
			children, shared, err := buildChildren(ctx, rc)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range unwantedChildren(rc, slices.Concat(children, shared), nil) {
				if o.GetNamespace() != rc.Namespace {
					t.Fatalf("%s in namespace %q", o.GetName(), o.GetNamespace())
				}
				got = append(got, o.GetObjectKind().GroupVersionKind().Kind+" "+o.GetName())
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("unwanted %q, want %q", got, tt.want)
			}
		})
	}
}

// A custom head Service's ports come from a map: whatever their order, the
// Service the writer applies (and so its hash) is the same.
func TestHeadServicePortsInOneOrder(t *testing.T) {
	svc := func(names ...string) *corev1.Service {
		s := &corev1.Service{}
		for i, n := range names {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: n, Port: int32(6000 + i)})
		}
		return service(s)
	}
	a, b := svc("gcs-server", "dashboard", "client"), svc("client", "gcs-server", "dashboard")
	for i := range a.Spec.Ports {
		a.Spec.Ports[i].Port, b.Spec.Ports[i].Port = 0, 0
	}
	if apply.Hash(a) != apply.Hash(b) || a.Spec.Ports[0].Name != "client" {
		t.Fatalf("ports %v and %v", a.Spec.Ports, b.Spec.Ports)
	}
}

func TestApplied(t *testing.T) {
	now := time.Now()
	failure := string(rayv1.RayClusterReplicaFailure)
	st := rayv1.RayClusterStatus{}
	applied(&st, nil, nil, 1, now)
	if len(st.Conditions) != 0 {
		t.Fatalf("a successful first apply added %+v", st.Conditions)
	}
	applied(&st, errors.New("creating pod x: forbidden"), nil, 1, now)
	if c := meta.FindStatusCondition(st.Conditions, failure); c == nil || c.Status != metav1.ConditionTrue || c.Reason != "FailedToApply" {
		t.Fatalf("after a failure: %+v", c)
	}
	applied(&st, nil, nil, 1, now)
	if c := meta.FindStatusCondition(st.Conditions, failure); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Applied" {
		t.Fatalf("after a success: %+v", c)
	}

	// An optional child left out for a name taken: NameConflict, and
	// kstatus's conditions stay the pods' (nothing stalls).
	skipped := fmt.Errorf("%w: the cluster runs without it", &apply.ForeignError{Kind: "Service", Key: "ns/c-serve-svc", Reason: "is not managed by Loom"})
	st = rayv1.RayClusterStatus{}
	applied(&st, nil, skipped, 1, now)
	if c := meta.FindStatusCondition(st.Conditions, failure); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonNameConflict ||
		!strings.Contains(c.Message, "Service ns/c-serve-svc exists") || len(st.Conditions) != 1 {
		t.Fatalf("after a child skipped: %+v", st.Conditions)
	}
}

// lastUpdateTime moves only with the rest of the status.
func TestTouched(t *testing.T) {
	then, now := metav1.NewTime(time.Now().Add(-time.Hour)), time.Now()
	old := &rayv1.RayClusterStatus{State: rayv1.Ready, LastUpdateTime: &then}
	same := old.DeepCopy()
	same.LastUpdateTime = nil
	touched(old, same, now)
	if !same.LastUpdateTime.Equal(&then) {
		t.Fatalf("an unchanged status got lastUpdateTime %v", same.LastUpdateTime)
	}
	changed := old.DeepCopy()
	changed.ReadyWorkerReplicas = 3
	touched(old, changed, now)
	if changed.LastUpdateTime == nil || !changed.LastUpdateTime.After(then.Time) {
		t.Fatalf("a changed status kept lastUpdateTime %v", changed.LastUpdateTime)
	}
}

// GangScheduling is False while Volcano holds the PodGroup (with Volcano's
// reason) or its queue stops it, True otherwise.
func TestGangCondition(t *testing.T) {
	want := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "ray-c-pg"}, Spec: schedulingv1beta1.PodGroupSpec{Queue: "ray"}}
	held := schedulingv1beta1.PodGroupCondition{Type: schedulingv1beta1.PodGroupUnschedulableType, Status: corev1.ConditionTrue,
		Reason: "NotEnoughResources", Message: "3/3 tasks in gang unschedulable: Insufficient nvidia.com/gpu", LastTransitionTime: metav1.Now()}
	have := func(phase schedulingv1beta1.PodGroupPhase, conds ...schedulingv1beta1.PodGroupCondition) *schedulingv1beta1.PodGroup {
		return &schedulingv1beta1.PodGroup{Status: schedulingv1beta1.PodGroupStatus{Phase: phase, Conditions: conds}}
	}
	missing := gang.CheckQueue("ray", nil)
	tests := []struct {
		name   string
		have   *schedulingv1beta1.PodGroup
		queue  gang.QueueProblem
		status metav1.ConditionStatus
		reason string
		msg    string
	}{
		{"not created yet", nil, gang.QueueProblem{}, metav1.ConditionTrue, "PodGroupCreated", "through PodGroup ray-c-pg"},
		{"pending", have(schedulingv1beta1.PodGroupPending), gang.QueueProblem{}, metav1.ConditionTrue, "GangPending", "admit it to queue ray"},
		{"pending, held", have(schedulingv1beta1.PodGroupPending, held), gang.QueueProblem{}, metav1.ConditionFalse, "NotEnoughResources",
			"Volcano holds PodGroup ray-c-pg (Pending): NotEnoughResources: 3/3 tasks in gang unschedulable: Insufficient nvidia.com/gpu"},
		{"inqueue, held", have(schedulingv1beta1.PodGroupInqueue, held), gang.QueueProblem{}, metav1.ConditionFalse, "NotEnoughResources", "(Inqueue)"},
		{"running", have(schedulingv1beta1.PodGroupRunning, held), gang.QueueProblem{}, metav1.ConditionTrue, "PodGroupCreated", ""},
		{"queue missing", have(schedulingv1beta1.PodGroupPending), missing, metav1.ConditionFalse, gang.ReasonQueueNotFound, `Volcano queue "ray" does not exist`},
		{"queue missing, not created yet", nil, missing, metav1.ConditionFalse, gang.ReasonQueueNotFound, "PodGroup ray-c-pg"},
		{"queue closed after admission", have(schedulingv1beta1.PodGroupRunning), gang.QueueProblem{Reason: gang.ReasonQueueClosed}, metav1.ConditionTrue, "PodGroupCreated", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, reason, msg := gangCondition(want, tt.have, tt.queue)
			if s != tt.status || reason != tt.reason || !strings.Contains(msg, tt.msg) {
				t.Fatalf("gangCondition = %s %s %q; want %s %s containing %q", s, reason, msg, tt.status, tt.reason, tt.msg)
			}
		})
	}
}
