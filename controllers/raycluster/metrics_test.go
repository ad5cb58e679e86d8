package raycluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/loom-dev/loom/internal/testenv"
)

// KubeRay's RayCluster metrics, by KubeRay's names, help and labels, for
// the clusters Loom reconciles (not one another controller manages).
func TestClustersCollector(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := rayv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cond := metav1.Condition{Type: string(rayv1.RayClusterProvisioned), Status: metav1.ConditionTrue, Reason: "r", LastTransitionTime: metav1.Now()}
	objs := []client.Object{
		&rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", UID: "ua"}, Status: rayv1.RayClusterStatus{Conditions: []metav1.Condition{cond}}},
		&rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns", UID: "ub", Labels: map[string]string{utils.RayOriginatedFromCRDLabelKey: "RayJob"}}},
		&rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uc"}, Spec: rayv1.RayClusterSpec{ManagedBy: ptr.To("kueue.x-k8s.io/multikueue")}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	want := `
# HELP kuberay_cluster_condition_provisioned Indicates whether the RayCluster is provisioned
# TYPE kuberay_cluster_condition_provisioned gauge
kuberay_cluster_condition_provisioned{condition="false",name="b",namespace="ns",uid="ub"} 1
kuberay_cluster_condition_provisioned{condition="true",name="a",namespace="ns",uid="ua"} 1
# HELP kuberay_cluster_info Metadata information about RayCluster custom resources
# TYPE kuberay_cluster_info gauge
kuberay_cluster_info{name="a",namespace="ns",owner_kind="None",uid="ua"} 1
kuberay_cluster_info{name="b",namespace="ns",owner_kind="RayJob",uid="ub"} 1
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(&clustersCollector{cache: testenv.NoCopyLists{Reader: c, T: t}})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// The provisioned duration is set once, when RayClusterProvisioned turns
// True, and dropped with the cluster.
func TestObserveProvisioned(t *testing.T) {
	now := time.Now()
	rc := &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "dur", UID: "ud", CreationTimestamp: metav1.NewTime(now.Add(-42 * time.Second))}}
	provisioned := rayv1.RayClusterStatus{Conditions: []metav1.Condition{{Type: string(rayv1.RayClusterProvisioned), Status: metav1.ConditionTrue}}}
	g := provisionedDuration.WithLabelValues("d", "dur", "ud")
	observeProvisioned(rc, &rayv1.RayClusterStatus{}, &rayv1.RayClusterStatus{}, now)
	if v := testutil.ToFloat64(g); v != 0 {
		t.Fatalf("not provisioned: %v", v)
	}
	observeProvisioned(rc, &rayv1.RayClusterStatus{}, &provisioned, now)
	if v := testutil.ToFloat64(g); v != 42 {
		t.Fatalf("provisioned after 42 s: %v", v)
	}
	observeProvisioned(rc, &provisioned, &provisioned, now.Add(time.Hour))
	if v := testutil.ToFloat64(g); v != 42 {
		t.Fatalf("already provisioned: moved to %v", v)
	}
	forgetMetrics(client.ObjectKeyFromObject(rc))
	if n := testutil.CollectAndCount(provisionedDuration, "kuberay_cluster_provisioned_duration_seconds"); n != 0 {
		t.Fatalf("%d series left after the cluster went", n)
	}
}

// Against the API server: pods the namespace's quota refuses give the
// cluster a Warning event and an InProgress kstatus; once the quota goes,
// the cluster becomes ready, kstatus reads Current, and the manager's
// metrics registry reports KubeRay's metrics for it.
func TestFailedCreatesEventsAndMetrics(t *testing.T) {
	ctx := context.Background()
	startManager(t, "none")
	rc := sample(t, "ray-cluster.sample.yaml", "ray-quota")
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-pods", Namespace: rc.Namespace},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}}
	if err := env.Client.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	// No quota controller runs here: admission needs the status it keeps.
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
	if err := env.Client.Status().Update(ctx, quota); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		list := &eventsv1.EventList{}
		if err := env.Client.List(ctx, list, client.InNamespace(rc.Namespace)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Regarding.Kind == "RayCluster" && e.Regarding.Name == rc.Name && e.Type == corev1.EventTypeWarning &&
				e.Reason == "FailedCreatePod" && strings.Contains(e.Note, "exceeded quota") {
				return nil
			}
		}
		return fmt.Errorf("no FailedCreatePod Warning on the RayCluster among %d events", len(list.Items))
	})
	if got := liveKstatus(t, rc); got != kstatus.InProgressStatus {
		t.Fatalf("kstatus with pods refused: %s", got)
	}
	if err := env.Client.Delete(ctx, quota); err != nil {
		t.Fatal(err)
	}
	pods := waitPods(t, rc, map[string]int{"headgroup": 1, "workergroup": 1})
	ready(t, pods["headgroup"][0], pods["workergroup"][0])
	got := waitState(t, rc, rayv1.Ready)
	testenv.Eventually(t, 10*time.Second, func() error {
		if s := liveKstatus(t, rc); s != kstatus.CurrentStatus {
			return fmt.Errorf("kstatus %s, want Current", s)
		}
		return nil
	})
	labels := fmt.Sprintf(`name=%q,namespace=%q`, rc.Name, rc.Namespace)
	for _, series := range []string{
		fmt.Sprintf(`kuberay_cluster_info{%s,owner_kind="None",uid=%q} 1`, labels, got.UID),
		fmt.Sprintf(`kuberay_cluster_condition_provisioned{condition="true",%s,uid=%q} 1`, labels, got.UID),
		fmt.Sprintf(`kuberay_cluster_provisioned_duration_seconds{%s,uid=%q}`, labels, got.UID),
	} {
		testenv.Eventually(t, 10*time.Second, func() error {
			if text := gathered(t); !strings.Contains(text, series) {
				return fmt.Errorf("the registry lacks %s", series)
			}
			return nil
		})
	}
}

// liveKstatus is kstatus's reading of the cluster as the API server has it.
func liveKstatus(t *testing.T, rc *rayv1.RayCluster) kstatus.Status {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(rayv1.GroupVersion.WithKind("RayCluster"))
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(rc), u); err != nil {
		t.Fatal(err)
	}
	res, err := kstatus.Compute(u)
	if err != nil {
		t.Fatal(err)
	}
	return res.Status
}

// gathered is controller-runtime's metrics registry in the text format.
func gathered(t *testing.T) string {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			fmt.Fprintf(&b, "%s{%s} %v\n", f.GetName(), strings.Join(ls, ","), m.GetGauge().GetValue())
		}
	}
	return b.String()
}
