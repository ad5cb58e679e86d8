package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/controllers/monitoring"
	"github.com/loom-dev/loom/internal/agent"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// forbidden records every request an identity made that the API server
// refused with 403 Forbidden.
type forbidden struct {
	mu   sync.Mutex
	seen []string
}

func (f *forbidden) wrap(who string) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if err == nil && resp.StatusCode == http.StatusForbidden {
				f.mu.Lock()
				f.seen = append(f.seen, fmt.Sprintf("%s: %s %s", who, req.Method, req.URL.RequestURI()))
				f.mu.Unlock()
			}
			return resp, err
		})
	}
}

func (f *forbidden) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Compact(slices.Sorted(slices.Values(f.seen)))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// asServiceAccount is cfg impersonating the chart's ServiceAccount name in
// loom-system, with the node name a token bound to a pod on node carries
// (none when node is empty), every response it gets counted by f.
func asServiceAccount(cfg *rest.Config, name, node string, f *forbidden) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + rbacNS + ":" + name}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
	}
	cfg.Wrap(f.wrap(name))
	return cfg
}

const rbacNS = "loom-system"

// TestChartRBACSuffices runs the manager (every controller, as `loom
// manager` does, CRD check included) and a node agent with exactly the
// rights the chart gives their ServiceAccounts, its admission policies
// judging their writes, drives one object of each kind through its happy
// path, has a scraper read its metrics, then plays the cluster's other
// actors until the later write paths have run (CRDs an older release
// applied, a driver upgrade with its cordon, eviction and driver pod
// delete, a RayJob on its ready cluster to the end, a Kueue Workload
// released and deleted), and fails on any request the API server refuses
// as Forbidden: a rule missing from the chart shows here instead of only
// end to end.
func TestChartRBACSuffices(t *testing.T) {
	// The manager's errors, as testenv.Main prints them (controller-runtime
	// dumps a stack of its own when no logger is set by 30 s).
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel), zap.UseDevMode(true)))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := testenv.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	c := env.Client
	must(t, env.CreateNamespace(ctx, rbacNS))
	must(t, env.CreateNamespace(ctx, "ml"))
	objs, err := testenv.RenderChart(rbacNS)
	must(t, err)
	objs = slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool {
		return o.GetAPIVersion() != rbacv1.SchemeGroupVersion.String() && !strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") &&
			o.GetKind() != "ServiceAccount" && o.GetKind() != "Service" // the manager's metrics Service, its ServiceMonitor's owner
	})
	must(t, testenv.Apply(ctx, env.Config, c, objs))

	var refused forbidden
	// A GPU node its agent (run as the chart's node agent) publishes.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-0"}}
	must(t, c.Create(ctx, node))
	node.Status.Capacity = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("32"), corev1.ResourceCPU: resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"), corev1.ResourcePods: resource.MustParse("110")}
	node.Status.Allocatable = node.Status.Capacity
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	must(t, c.Status().Update(ctx, node))
	agentClient, err := client.New(asServiceAccount(env.Config, "loom-node-agent", "gpu-0", &refused), client.Options{Scheme: manager.Scheme()})
	must(t, err)
	sim, err := collect.Simulate(collect.SimOptions{System: "dgx-h100", Seed: "gpu-0"})
	must(t, err)
	agentCtx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	a := &agent.Agent{NodeName: "gpu-0", Lib: sim, Client: agentClient, Log: ctrl.Log.WithName("agent"), Interval: time.Hour,
		Simulated: "dgx-h100", Metrics: agent.NewMetrics()}
	go func() { _ = a.Run(agentCtx) }()

	mgrCfg := asServiceAccount(env.Config, "loom-manager", "", &refused)
	olderCRDs(ctx, t, c)
	must(t, applyCRDs(ctx, mgrCfg))
	crdsApplied(ctx, t, c)
	installWorkloadCRD(ctx, t, env)
	ray := startRayDashboard(t)
	opts := testenv.ManagerOptions(t)
	opts.Namespace = rbacNS
	opts.MetricsServiceMonitor = "loom-metrics" // the chart's default
	mgr, _, err := manager.New(ctx, mgrCfg, opts, registry())
	must(t, err)
	mgrCtx, stopMgr := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	defer func() {
		stopMgr()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	// A driver version naming its OS: one driver DaemonSet for every node.
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	cp.Spec.Driver.Image.Version = "570.172.08-ubuntu22.04"
	must(t, c.Create(ctx, cp))
	samples, err := testenv.ReadManifests(filepath.Join(env.Root, "config", "samples"))
	must(t, err)
	var rc *rayv1.RayCluster
	for _, u := range samples {
		u.SetNamespace("ml")
		must(t, c.Create(ctx, u))
		if u.GetKind() == "RayCluster" {
			rc = &rayv1.RayCluster{}
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, rc))
		}
	}
	// A cluster with KubeRay's serve Service and dashboard Ingress.
	served := &rayv1.RayCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "ray-served",
		Annotations: map[string]string{"ray.io/enable-serve-service": "true"}}, Spec: *rc.Spec.DeepCopy()}
	served.Spec.HeadGroupSpec.EnableIngress = ptr.To(true)
	must(t, c.Create(ctx, served))
	must(t, c.Create(ctx, &rayv1.RayJob{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "rayjob"},
		Spec: rayv1.RayJobSpec{Entrypoint: "python -c 'print(1)'", RayClusterSpec: &rc.Spec, ShutdownAfterJobFinishes: true}}))
	must(t, c.Create(ctx, queuedJob()))

	// Each controller got as far as writing its children.
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := refused.list(); len(got) > 0 {
			t.Fatalf("the chart's RBAC refused:\n%s", strings.Join(got, "\n"))
		}
		var missing []string
		for _, w := range []struct {
			what string
			obj  client.Object
			key  client.ObjectKey
		}{
			{"the GPU labeller's node labels", &corev1.Node{}, client.ObjectKey{Name: "gpu-0"}},
			{"the node agent's GPUNode", &gpuv1alpha1.GPUNode{}, client.ObjectKey{Name: "gpu-0"}},
			{"the ClusterPolicy's device plugin", &appsv1.DaemonSet{}, client.ObjectKey{Namespace: rbacNS, Name: "loom-device-plugin"}},
			{"the ClusterPolicy's RuntimeClass", &nodev1.RuntimeClass{}, client.ObjectKey{Name: "nvidia"}},
			{"the driver's ClusterRoleBinding", &rbacv1.ClusterRoleBinding{}, client.ObjectKey{Name: rbacNS + "-loom-driver"}},
			{"the TrainingJob's master pod", &corev1.Pod{}, client.ObjectKey{Namespace: "ml", Name: "pytorch-ddp-master-0"}},
			{"the RayCluster's head Service", &corev1.Service{}, client.ObjectKey{Namespace: "ml", Name: "ray-gpu-head-svc"}},
			{"the RayCluster's serve Service", &corev1.Service{}, client.ObjectKey{Namespace: "ml", Name: "ray-served-serve-svc"}},
			{"the RayCluster's dashboard Ingress", &networkingv1.Ingress{}, client.ObjectKey{Namespace: "ml", Name: "ray-served-head-ingress"}},
			{"the GPU alert rules", &monitoringv1.PrometheusRule{}, client.ObjectKey{Namespace: rbacNS, Name: monitoring.RuleName}},
			{"the manager's ServiceMonitor", &monitoringv1.ServiceMonitor{}, client.ObjectKey{Namespace: rbacNS, Name: monitoring.ManagerServiceMonitorName}},
			{"the Grafana dashboards", &corev1.ConfigMap{}, client.ObjectKey{Namespace: rbacNS, Name: monitoring.DashboardsConfigMap}},
		} {
			if err := c.Get(ctx, w.key, w.obj); err != nil {
				missing = append(missing, w.what+": "+err.Error())
			} else if n, ok := w.obj.(*corev1.Node); ok && n.Labels[gpuv1alpha1.LabelPresent] != "true" {
				missing = append(missing, w.what+": not yet")
			}
		}
		job := &rayv1.RayJob{}
		must(t, c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: "rayjob"}, job))
		if job.Status.RayClusterName == "" || c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: job.Status.RayClusterName}, &rayv1.RayCluster{}) != nil {
			missing = append(missing, "the RayJob's RayCluster")
		}
		// Volcano admits the gang.
		pg := &schedulingv1beta1.PodGroup{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: "pytorch-ddp"}, pg); err != nil {
			missing = append(missing, "the TrainingJob's PodGroup: "+err.Error())
		} else if pg.Status.Phase == "" {
			pg.Status.Phase = schedulingv1beta1.PodGroupInqueue
			must(t, c.Update(ctx, pg)) // Volcano's CRD has no status subresource
		}
		tj := &trainingv1alpha1.TrainingJob{}
		must(t, c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: "pytorch-ddp"}, tj))
		if tj.Status.State == "" {
			missing = append(missing, "the TrainingJob's status")
		}
		if len(missing) > 0 {
			return fmt.Errorf("not yet written: %s", strings.Join(missing, "; "))
		}
		return nil
	})
	// A scraper the chart's metrics-reader role is bound to reads
	// /metrics: the manager reviews its token and its access.
	must(t, c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: rbacNS, Name: "prometheus"}}))
	must(t, c.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "prometheus-loom-metrics"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "loom-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: rbacNS, Name: "prometheus"}}}))
	token, err := kubernetes.NewForConfigOrDie(env.Config).CoreV1().ServiceAccounts(rbacNS).CreateToken(ctx, "prometheus",
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	must(t, err)
	scrape := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the manager's self-signed certificate
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+opts.MetricsAddr+"/metrics", nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+token.Status.Token)
	resp, err := scrape.Do(req)
	must(t, err)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("scraping /metrics as the metrics reader: %s", resp.Status)
	}

	// The later write paths, each as far as its end.
	play := &actors{c: c, ray: ray, node: "gpu-0"}
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := refused.list(); len(got) > 0 {
			t.Fatalf("the chart's RBAC refused:\n%s", strings.Join(got, "\n"))
		}
		if left := play.step(ctx, t); len(left) > 0 {
			return fmt.Errorf("not yet: %s", strings.Join(left, "; "))
		}
		return nil
	})
	// A few passes more, for writes that follow the last (status, events).
	time.Sleep(2 * time.Second)
	if got := refused.list(); len(got) > 0 {
		t.Errorf("the chart's RBAC refused:\n%s", strings.Join(got, "\n"))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
