package raycluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/podset"
)

// unitCluster is KubeRay's sample, normalized after mutate, with a UID.
func unitCluster(t *testing.T, mutate func(*rayv1.RayCluster)) *rayv1.RayCluster {
	t.Helper()
	rc := sample(t, "ray-cluster.sample.yaml", "unit")
	rc.UID = "u1"
	mutate(rc)
	return normalized(rc)
}

// validCondition is the cluster's spec-validity condition after one pass.
func validCondition(d decision) *metav1.Condition {
	return meta.FindStatusCondition(d.status.Conditions, ConditionValid)
}

// Every problem is reported on loom.dev/SpecValid naming its field, and
// the cluster is held: nothing is created or deleted.
func TestValidationNamesTheField(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*rayv1.RayCluster)
		reason string
		want   []string // substrings of the message
	}{
		{"name too long for KubeRay", func(rc *rayv1.RayCluster) { rc.Name = strings.Repeat("r", 54) },
			ReasonInvalidSpec, []string{"metadata.name: RayCluster name should be no more than 53 characters"}},
		{"name not a DNS-1035 label", func(rc *rayv1.RayCluster) { rc.Name = "Ray_Cluster" },
			ReasonInvalidSpec, []string{"metadata.name: RayCluster name should be a valid DNS1035 label"}},
		{"group name not a DNS-1123 label", func(rc *rayv1.RayCluster) { rc.Spec.WorkerGroupSpecs[0].GroupName = "GPU_Workers" },
			ReasonInvalidSpec, []string{`spec.workerGroupSpecs[0].groupName: "GPU_Workers" is not a DNS-1123 label`}},
		{"group name too long", func(rc *rayv1.RayCluster) { rc.Spec.WorkerGroupSpecs[0].GroupName = strings.Repeat("g", 64) },
			ReasonInvalidSpec, []string{"spec.workerGroupSpecs[0].groupName", "must be no more than 63 characters"}},
		{"group name empty", func(rc *rayv1.RayCluster) { rc.Spec.WorkerGroupSpecs[0].GroupName = "" },
			ReasonInvalidSpec, []string{`spec.workerGroupSpecs[0].groupName: "" is not a DNS-1123 label`}},
		{"group named like the head", func(rc *rayv1.RayCluster) { rc.Spec.WorkerGroupSpecs[0].GroupName = "headgroup" },
			ReasonInvalidSpec, []string{"spec.workerGroupSpecs[0].groupName: worker group name \"headgroup\" is reserved"}},
		{"duplicate group", func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, *rc.Spec.WorkerGroupSpecs[0].DeepCopy())
		}, ReasonInvalidSpec, []string{"spec.workerGroupSpecs[1].groupName: worker group name \"workergroup\" is used twice"}},
		{"minReplicas above maxReplicas", func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs[0].MinReplicas, rc.Spec.WorkerGroupSpecs[0].MaxReplicas = ptr.To[int32](4), ptr.To[int32](2)
		}, ReasonInvalidSpec, []string{"spec.workerGroupSpecs[0].minReplicas: 4 is more than maxReplicas (2)"}},
		{"negative replicas", func(rc *rayv1.RayCluster) { rc.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](-3) },
			ReasonInvalidSpec, []string{"spec.workerGroupSpecs[0].replicas: -3 is negative"}},
		{"custom head Service name too long", func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.HeadService = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("s", 64)}}
		}, ReasonInvalidSpec, []string{"spec.headGroupSpec.headService.metadata.name: the head Service's name", "(64 characters)"}},
		{"serve Service without a serve port", func(rc *rayv1.RayCluster) {
			rc.Annotations = map[string]string{"ray.io/enable-serve-service": "true"}
		}, ReasonInvalidSpec, []string{"spec.headGroupSpec.template.spec.containers[0].ports: no port is named serve", "ray.io/enable-serve-service=true"}},
		{"Ingress class no IngressClass name", func(rc *rayv1.RayCluster) {
			rc.Annotations = map[string]string{"kubernetes.io/ingress.class": "Nginx_Public"}
			rc.Spec.HeadGroupSpec.EnableIngress = ptr.To(true)
		}, ReasonInvalidSpec, []string{`metadata.annotations[kubernetes.io/ingress.class]: "Nginx_Public", the Ingress's class, is no IngressClass name`}},
		{"Ingress to a dashboard port the head Service lacks", func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.EnableIngress = ptr.To(true)
			rc.Spec.HeadGroupSpec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "gcs-server", ContainerPort: 6379}, {Name: "client", ContainerPort: 10001}}
		}, ReasonInvalidSpec, []string{"spec.headGroupSpec.template.spec.containers[0].ports: no port is named dashboard", "8265", "enableIngress"}},
		{"KubeRay's spec validator, on a worker group", func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs[0].Template.Spec.Containers = nil
		}, ReasonInvalidSpec, []string{"spec.workerGroupSpecs[0]: workerGroupSpec should have at least one container"}},
		{"KubeRay's spec validator, on the head", func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.RayStartParams = map[string]string{"labels": "a=b"}
		}, ReasonInvalidSpec, []string{"spec: rayStartParams['labels'] is not supported for Head group"}},
		{"pod template label", func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs[0].Template.Labels = map[string]string{"team": "a b"}
		}, ReasonInvalidSpec, []string{"spec.workerGroupSpecs[0].template.metadata.labels: Invalid value: \"a b\""}},
		{"head Service label", func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.HeadService = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"bad key!": "v"}}}
		}, ReasonInvalidSpec, []string{"spec.headGroupSpec.headService.metadata.labels: Invalid value: \"bad key!\""}},
		{"head pod name from its template", func(rc *rayv1.RayCluster) { rc.Spec.HeadGroupSpec.Template.Name = "Head" },
			ReasonInvalidSpec, []string{`spec.headGroupSpec.template.metadata.name: "Head" is not a valid pod name`}},
		{"toleration operator and effect", func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs[0].Template.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: "Foo", Effect: "Bad"}}
		}, ReasonInvalidSpec, []string{`spec.workerGroupSpecs[0].template.spec.tolerations[0].operator: unsupported value "Foo"`,
			`spec.workerGroupSpecs[0].template.spec.tolerations[0].effect: unsupported value "Bad"`}},
		{"head toleration without a key", func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.Template.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpEqual, Value: "x"}}
		}, ReasonInvalidSpec, []string{`spec.headGroupSpec.template.spec.tolerations[0].operator: must be Exists when key is empty`}},
		{"thousands of bad tolerations: the first five named", func(rc *rayv1.RayCluster) {
			for range 5000 {
				rc.Spec.WorkerGroupSpecs[0].Template.Spec.Tolerations = append(rc.Spec.WorkerGroupSpecs[0].Template.Spec.Tolerations, corev1.Toleration{Key: "k", Effect: "Bad"})
			}
		}, ReasonInvalidSpec, []string{"tolerations[0].effect", "tolerations[4].effect"}},
		{"node affinity operator", func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs[0].Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: "Foo"}}}}}}}
		}, ReasonInvalidSpec, []string{`spec.workerGroupSpecs[0].template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator: unsupported value "Foo"`}},
		{"pod anti-affinity without a topology key, weight out of range", func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 1000}}}}
		}, ReasonInvalidSpec, []string{"podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: 1000 is not in the range 1-100",
			"podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey: can not be empty"}},
		{"more pods than --max-workload-pods", func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs[0].Replicas, rc.Spec.WorkerGroupSpecs[0].MaxReplicas = ptr.To[int32](100000), ptr.To[int32](100000)
		}, ReasonTooManyPods, []string{"asks for 100001 pods", "spec.workerGroupSpecs[0] (group \"workergroup\"): 100000 replicas × 1 hosts", "more than the 5000 pods", "--max-workload-pods"}},
		{"replicas × numOfHosts past int32", func(rc *rayv1.RayCluster) {
			g := &rc.Spec.WorkerGroupSpecs[0]
			g.Replicas, g.MaxReplicas, g.NumOfHosts = ptr.To[int32](1<<30+1), ptr.To[int32](math.MaxInt32), 2
		}, ReasonTooManyPods, []string{"asks for 2147483651 pods", "1073741825 replicas × 2 hosts"}},
		{"every group at int32's maximum", func(rc *rayv1.RayCluster) {
			g := rc.Spec.WorkerGroupSpecs[0]
			g.Replicas, g.MaxReplicas, g.NumOfHosts = ptr.To[int32](math.MaxInt32), ptr.To[int32](math.MaxInt32), math.MaxInt32
			rc.Spec.WorkerGroupSpecs = nil
			for i := range 4 {
				g.GroupName = fmt.Sprintf("g%d", i)
				rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, *g.DeepCopy())
			}
		}, ReasonTooManyPods, []string{"asks for more than 4611686018427387904 pods"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := unitCluster(t, tt.mutate)
			head := buildHeadPod(context.Background(), unitCluster(t, func(*rayv1.RayCluster) {}), "")
			head.Name, head.UID, head.Annotations[AnnotationTemplateHash] = "h", "uh", "outdated"
			head.OwnerReferences = []metav1.OwnerReference{ownerRef(rc)}
			d := decide(context.Background(), rc, observed{pods: []*corev1.Pod{head}, now: time.Now()}, "none")
			c := validCondition(d)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != tt.reason {
				t.Fatalf("condition %+v, want False %s", c, tt.reason)
			}
			for _, w := range tt.want {
				if !strings.Contains(c.Message, w) {
					t.Errorf("message %q lacks %q", c.Message, w)
				}
			}
			if len(d.create) != 0 || len(d.remove) != 0 {
				t.Fatalf("a held cluster: create %d remove %d", len(d.create), len(d.remove))
			}
		})
	}
}

// The dashboard Ingress sends to the head Service's port 8265 unless the
// head container names another dashboard port: a head Service with that
// port, under any name, is all it needs.
func TestIngressFindsTheDashboardPort(t *testing.T) {
	ports := func(ps ...corev1.ContainerPort) func(*rayv1.RayCluster) {
		return func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.EnableIngress = ptr.To(true)
			rc.Spec.HeadGroupSpec.Template.Spec.Containers[0].Ports = ps
		}
	}
	gcs := corev1.ContainerPort{Name: "gcs-server", ContainerPort: 6379}
	for _, tt := range []struct {
		name    string
		mutate  func(*rayv1.RayCluster)
		invalid bool
	}{
		{"KubeRay's default ports", ports(), false},
		{"named dashboard, another number", ports(gcs, corev1.ContainerPort{Name: "dashboard", ContainerPort: 9000}), false},
		{"8265 under another name", ports(gcs, corev1.ContainerPort{Name: "ui", ContainerPort: 8265}), false},
		{"8265 in the custom head Service", func(rc *rayv1.RayCluster) {
			ports(gcs)(rc)
			rc.Spec.HeadGroupSpec.HeadService = &corev1.Service{Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "ui", Port: 8265}}}}
		}, false},
		{"no dashboard port", ports(gcs), true},
		{"no dashboard port, Ingress off", func(rc *rayv1.RayCluster) {
			ports(gcs)(rc)
			rc.Spec.HeadGroupSpec.EnableIngress = ptr.To(false)
		}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := validateCluster(unitCluster(t, tt.mutate), "none")
			if (err != nil) != tt.invalid {
				t.Fatalf("validateCluster: %v, want invalid %v", err, tt.invalid)
			}
		})
	}
}

// Workers dial the head Service at the head's rayStartParams port: a
// value that is no port number, or, through a Service that is not
// headless, a port the Service lacks, is invalid.
func TestHeadPortReachesTheWorkers(t *testing.T) {
	lb := func(port string, ps ...corev1.ContainerPort) func(*rayv1.RayCluster) {
		return func(rc *rayv1.RayCluster) {
			rc.Spec.HeadGroupSpec.ServiceType = corev1.ServiceTypeLoadBalancer
			if port != "" {
				rc.Spec.HeadGroupSpec.RayStartParams = map[string]string{"port": port}
			}
			if ps != nil {
				rc.Spec.HeadGroupSpec.Template.Spec.Containers[0].Ports = ps
			}
		}
	}
	for _, tt := range []struct {
		name   string
		mutate func(*rayv1.RayCluster)
		want   string // "" valid
	}{
		{"the sample", func(*rayv1.RayCluster) {}, ""},
		{"LoadBalancer, the default port", lb(""), ""},
		{"LoadBalancer, KubeRay's default ports", lb("", []corev1.ContainerPort{}...), ""},
		{"headless, another port", func(rc *rayv1.RayCluster) { rc.Spec.HeadGroupSpec.RayStartParams = map[string]string{"port": "6380"} }, ""},
		{"LoadBalancer, another port the container has", lb("6380", corev1.ContainerPort{Name: "gcs-server", ContainerPort: 6380}), ""},
		{"LoadBalancer, another port the Service lacks", lb("6380"),
			"spec.headGroupSpec.rayStartParams[port]: the workers dial the head Service (type LoadBalancer) at port 6380, which it lacks"},
		{"LoadBalancer, container ports without 6379", lb("", corev1.ContainerPort{Name: "dashboard", ContainerPort: 8265}),
			"at port 6379, which it lacks"},
		{"no port number", func(rc *rayv1.RayCluster) { rc.Spec.HeadGroupSpec.RayStartParams = map[string]string{"port": "abc"} },
			`spec.headGroupSpec.rayStartParams[port]: "abc" is no port number (1-65535)`},
		{"port 0", func(rc *rayv1.RayCluster) { rc.Spec.HeadGroupSpec.RayStartParams = map[string]string{"port": "0"} },
			`"0" is no port number`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := validateCluster(unitCluster(t, tt.mutate), "none")
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("invalid: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("validateCluster: %v, want %q", err, tt.want)
			}
		})
	}
}

// A valid cluster has no spec-validity condition (a fixed one loses it).
func TestValidClusterHasNoSpecCondition(t *testing.T) {
	rc := unitCluster(t, func(*rayv1.RayCluster) {})
	rc.Status.Conditions = []metav1.Condition{{Type: ConditionValid, Status: metav1.ConditionFalse, Reason: ReasonTooManyPods}}
	d := decide(context.Background(), rc, observed{now: time.Now()}, "none")
	if c := validCondition(d); c != nil || len(d.create) != 2 {
		t.Fatalf("condition %+v, creates %d", c, len(d.create))
	}
}

// One pass builds at most what the executor creates in a pass, shared by
// the groups in rollout order and less the pass's deletes; the rest is
// deferred, so a pass's memory does not grow with the cluster.
func TestBuildIsBoundedPerPass(t *testing.T) {
	scale := func(replicas ...int32) func(*rayv1.RayCluster) {
		return func(rc *rayv1.RayCluster) {
			g := rc.Spec.WorkerGroupSpecs[0]
			rc.Spec.WorkerGroupSpecs = nil
			for i, n := range replicas {
				g.GroupName = fmt.Sprintf("g%d", i)
				g.Replicas, g.MaxReplicas = ptr.To(n), ptr.To(n)
				rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, *g.DeepCopy())
			}
		}
	}
	tests := []struct {
		name     string
		mutate   func(*rayv1.RayCluster)
		finished int // failed pods observed (deleted this pass)
		limit    int
		perGroup map[string]int
		deferred int64
	}{
		{"100,000 replicas", scale(100000), 0, 200000, map[string]int{headGroup: 1, "g0": podset.PerPass - 1}, 100001 - podset.PerPass},
		{"shared by groups", scale(700, 700), 0, 0, map[string]int{headGroup: 1, "g0": 700, "g1": podset.PerPass - 701}, 1401 - podset.PerPass},
		{"less the deletes", scale(1000), 100, 0, map[string]int{headGroup: 1, "g0": podset.PerPass - 101}, 1001 - (podset.PerPass - 100)},
		{"deletes fill the pass", scale(1000), podset.PerPass + 1, 0, map[string]int{}, 1001},
		{"small", scale(3), 0, 0, map[string]int{headGroup: 1, "g0": 3}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := unitCluster(t, tt.mutate)
			var pods []*corev1.Pod
			for i := range tt.finished {
				pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("done-%d", i), UID: types.UID(fmt.Sprintf("u-%d", i)),
					Labels: map[string]string{"ray.io/node-type": "worker", "ray.io/group": "g0"}, OwnerReferences: []metav1.OwnerReference{ownerRef(rc)}},
					Status: corev1.PodStatus{Phase: corev1.PodFailed}})
			}
			d := decide(context.Background(), rc, observed{pods: pods, now: time.Now(), maxPods: tt.limit}, "none")
			got := map[string]int{}
			for _, p := range d.create {
				got[groupOf(p)]++
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.perGroup) || d.deferred != tt.deferred || len(d.remove) != tt.finished {
				t.Fatalf("built %v deferred %d removed %d, want %v deferred %d removed %d", got, d.deferred, len(d.remove), tt.perGroup, tt.deferred, tt.finished)
			}
			if c := validCondition(d); c != nil {
				t.Fatalf("condition %+v", c)
			}
		})
	}
}

// A template the API server admits but that makes big pods (thousands of
// tolerations) builds at most buildBytes of pods a pass, at least one; the
// rest are deferred.
func TestBuildIsBoundedInBytes(t *testing.T) {
	for _, tolerations := range []int{20000, 200000} {
		rc := unitCluster(t, func(rc *rayv1.RayCluster) {
			g := &rc.Spec.WorkerGroupSpecs[0]
			g.Replicas, g.MaxReplicas = ptr.To[int32](1000), ptr.To[int32](1000)
			for i := range tolerations {
				g.Template.Spec.Tolerations = append(g.Template.Spec.Tolerations, corev1.Toleration{Key: fmt.Sprintf("example.com/taint-%d", i), Operator: corev1.TolerationOpExists})
			}
		})
		d := decide(context.Background(), rc, observed{now: time.Now()}, "none")
		var total int64
		workers := 0
		for _, p := range d.create {
			total += int64(p.Size())
			if groupOf(p) != headGroup {
				workers++
			}
		}
		size := int64(d.create[len(d.create)-1].Size())
		if len(d.create) == 0 || (len(d.create) > 1 && total > buildBytes) || workers >= 1000 || d.deferred != int64(1000-workers) {
			t.Fatalf("%d tolerations (pods of %d bytes): built %d pods (%d bytes), deferred %d", tolerations, size, len(d.create), total, d.deferred)
		}
	}
}

// Status counts are computed in 64 bits and capped: KubeRay's helpers
// overflow (maxReplicas' default × numOfHosts is negative in int32).
func TestStatusCountsDoNotOverflow(t *testing.T) {
	rc := unitCluster(t, func(rc *rayv1.RayCluster) {
		g := &rc.Spec.WorkerGroupSpecs[0]
		g.MaxReplicas, g.NumOfHosts = nil, 2
		rc.Spec.WorkerGroupSpecs = append(rc.Spec.WorkerGroupSpecs, *g.DeepCopy())
		rc.Spec.WorkerGroupSpecs[1].GroupName = "second"
	})
	d := decide(context.Background(), rc, observed{now: time.Now()}, "none")
	st := d.status
	if st.MaxWorkerReplicas != math.MaxInt32 || st.MinWorkerReplicas != 4 || st.DesiredWorkerReplicas != 4 {
		t.Fatalf("min %d desired %d max %d", st.MinWorkerReplicas, st.DesiredWorkerReplicas, st.MaxWorkerReplicas)
	}
	// Resources too: 1e15 CPUs × 2^40 pods overflows int64 milli-CPUs.
	if q, want := times(resource.MustParse("1e15"), 1<<40), resource.MustParse("1099511627776e15"); q.Cmp(want) != 0 {
		t.Fatalf("1e15 × 2^40 = %s, want %s", q.String(), want.String())
	}
	if q := times(resource.MustParse("500m"), 3); q.Cmp(resource.MustParse("1500m")) != 0 {
		t.Fatalf("500m × 3 = %s", q.String())
	}
}

// Pods the cluster does not control are never counted, kept or deleted:
// not when their labels say they are its head, not when it suspends.
func TestAnotherOwnersPodsAreLeftAlone(t *testing.T) {
	ctx := context.Background()
	rc := unitCluster(t, func(*rayv1.RayCluster) {})
	stranger := buildHeadPod(ctx, rc, "")
	stranger.Name, stranger.UID, stranger.OwnerReferences = "stranger", "us", nil
	stranger.Status.Phase = corev1.PodFailed
	other := buildWorkerPod(ctx, rc, &rc.Spec.WorkerGroupSpecs[0], "")
	other.Name, other.UID = "other", "uo"
	other.OwnerReferences[0].UID = "another-cluster"
	d := decide(ctx, rc, observed{pods: []*corev1.Pod{stranger, other}, now: time.Now()}, "none")
	if len(d.create) != 2 || len(d.remove) != 0 || d.status.Head.PodName != "" {
		t.Fatalf("create %d remove %d head %q", len(d.create), len(d.remove), d.status.Head.PodName)
	}
	rc.Spec.Suspend = ptr.To(true)
	d = decide(ctx, rc, observed{pods: []*corev1.Pod{stranger, other}, now: time.Now()}, "none")
	if len(d.remove) != 0 || d.status.State != rayv1.Suspended {
		t.Fatalf("suspend removes %d, state %q", len(d.remove), d.status.State)
	}
}

// A status that suspends or resumes is written guarded by the
// resourceVersion it was computed from; a steady one is not.
func TestSuspendAndResumeAreGuarded(t *testing.T) {
	rc := unitCluster(t, func(*rayv1.RayCluster) {})
	if d := decide(context.Background(), rc, observed{now: time.Now()}, "none"); d.guard {
		t.Fatal("a plain pass is guarded")
	}
	rc.Spec.Suspend = ptr.To(true)
	d := decide(context.Background(), rc, observed{now: time.Now()}, "none")
	if !d.guard {
		t.Fatal("suspend is not guarded")
	}
	rc.Status = d.status
	rc.Spec.Suspend = ptr.To(false)
	if d := decide(context.Background(), rc, observed{now: time.Now()}, "none"); !d.guard {
		t.Fatal("resume is not guarded")
	}
}

// A name taken by a pod or a child the cluster does not control is a
// NameConflict naming it; other failures stay FailedToApply.
func TestNameConflictReason(t *testing.T) {
	now := time.Now()
	failure := string(rayv1.RayClusterReplicaFailure)
	tests := []struct {
		err    error
		reason string
		names  string
	}{
		{errors.New("creating pod c-worker-x: forbidden: exceeded quota"), "FailedToApply", "exceeded quota"},
		{fmt.Errorf("creating pod c-head: %w", &podset.ConflictError{Namespace: "ns", Pod: "c-head", Owner: "c"}), ReasonNameConflict, "pod c-head exists and is not controlled by c"},
		{fmt.Errorf("%w: rename", &apply.ForeignError{Kind: "Service", Key: "ns/c-head-svc", Reason: "is not managed by Loom"}), ReasonNameConflict, "Service ns/c-head-svc exists"},
	}
	for _, tt := range tests {
		st := rayv1.RayClusterStatus{}
		applied(&st, tt.err, nil, 1, now)
		c := meta.FindStatusCondition(st.Conditions, failure)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != tt.reason || !strings.Contains(c.Message, tt.names) {
			t.Errorf("%v: condition %+v", tt.err, c)
		}
	}
}

// With KubeRay's ENABLE_DETERMINISTIC_HEAD_POD_NAME the head pod has a
// fixed, valid name (not a generateName prefix used as a name).
func TestDeterministicHeadPodName(t *testing.T) {
	t.Setenv("ENABLE_DETERMINISTIC_HEAD_POD_NAME", "true")
	rc := unitCluster(t, func(*rayv1.RayCluster) {})
	p := buildHeadPod(context.Background(), rc, "")
	if p.Name != rc.Name+"-head" || p.GenerateName != "" {
		t.Fatalf("name %q generateName %q", p.Name, p.GenerateName)
	}
}

// A cluster gang-scheduled through Volcano whose ray.io/priority-class-name
// label no PriorityClass can be named (capitals, a leading dot) is held
// naming the label: nothing is made, no PodGroup asks Volcano for it.
// Without Volcano the label is read by nothing, and holds nothing.
func TestPriorityClassLabelIsAName(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		value, sched string
		held         bool
	}{{"High", "volcano", true}, {".high", "volcano", true}, {"high-priority", "volcano", false}, {"High", "none", false}} {
		rc := unitCluster(t, func(rc *rayv1.RayCluster) { rc.Labels = map[string]string{LabelPriorityClass: tt.value} })
		d := decide(ctx, rc, observed{volcano: true, now: time.Now()}, tt.sched)
		c := validCondition(d)
		if !tt.held {
			if c != nil || len(d.create) == 0 {
				t.Errorf("%q under %s: condition %+v, creates %d", tt.value, tt.sched, c, len(d.create))
			}
			continue
		}
		if c == nil || c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, "metadata.labels[ray.io/priority-class-name]: "+fmt.Sprintf("%q", tt.value)+" is no PriorityClass name") {
			t.Errorf("%q: condition %+v", tt.value, c)
		}
		if len(d.create) != 0 || len(d.children) != 0 || d.podGroup != nil {
			t.Errorf("%q: held cluster makes %d pods, %d children, PodGroup %v", tt.value, len(d.create), len(d.children), d.podGroup)
		}
	}
}

// A cluster held at TooManyPods (the autoscaler raised a group past
// --max-workload-pods) creates nothing and rolls nothing, but still
// deletes the pods it no longer asks for: those in workersToDelete, beyond
// a lowered replicas, of a group gone. Otherwise the autoscaler could not
// scale down until it lowered replicas, and an idle cluster kept its GPUs.
func TestTooManyPodsStillDeletes(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		auto   bool
		mutate func(*rayv1.RayCluster)
		remove []string
	}{
		{"workersToDelete", true, func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs[0].ScaleStrategy.WorkersToDelete = []string{"a-1"}
			rc.Spec.WorkerGroupSpecs[1].ScaleStrategy.WorkersToDelete = []string{"b-0", "gone"}
		}, []string{"a-1", "b-0"}},
		{"beyond a lowered replicas", false, func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](1)
		}, []string{"a-0", "a-1"}}, // outdated first
		{"a group gone", false, func(rc *rayv1.RayCluster) {
			rc.Spec.WorkerGroupSpecs = rc.Spec.WorkerGroupSpecs[1:]
		}, []string{"a-0", "a-1", "a-2"}},
		{"autoscaler without workersToDelete", true, func(*rayv1.RayCluster) {}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := unitCluster(t, func(rc *rayv1.RayCluster) {
				rc.Spec.EnableInTreeAutoscaling = ptr.To(tt.auto)
				a := rc.Spec.WorkerGroupSpecs[0]
				a.GroupName, a.Replicas, a.MaxReplicas = "a", ptr.To[int32](3), ptr.To[int32](100)
				b := *a.DeepCopy()
				b.GroupName, b.Replicas = "b", ptr.To[int32](50) // raised past the limit
				rc.Spec.WorkerGroupSpecs = []rayv1.WorkerGroupSpec{a, b}
			})
			head := buildHeadPod(ctx, rc, "")
			head.Name = "h"
			pods := []*corev1.Pod{head}
			for _, n := range []string{"a-0", "a-1", "a-2", "b-0"} {
				g := &rc.Spec.WorkerGroupSpecs[0]
				if n[0] == 'b' {
					g = &rc.Spec.WorkerGroupSpecs[1]
				}
				p := buildWorkerPod(ctx, rc, g, "")
				p.Name, p.UID, p.CreationTimestamp = n, types.UID("u-"+n), metav1.NewTime(time.Unix(int64(len(pods)), 0))
				p.Annotations[AnnotationTemplateHash] = "outdated" // held: not rolled
				pods = append(pods, p)
			}
			for _, p := range pods {
				p.Status.Phase = corev1.PodRunning
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			}
			tt.mutate(rc)
			d := decide(ctx, rc, observed{pods: pods, now: time.Now(), maxPods: 20}, "none")
			if c := validCondition(d); c == nil || c.Reason != ReasonTooManyPods || !strings.Contains(c.Message, "more than the 20 pods") {
				t.Fatalf("condition %+v", c)
			}
			got := podNames(d.remove)
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tt.remove))
			if len(d.create) != 0 || !slices.Equal(got, want) {
				t.Fatalf("creates %d, removes %v, want none and %v", len(d.create), got, want)
			}
		})
	}
}
