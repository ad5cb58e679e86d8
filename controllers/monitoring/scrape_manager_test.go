package monitoring

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// managerMetrics has the manager scrape its own metrics Service, as the
// chart's default does.
func managerMetrics(o *manager.Options) {
	o.MetricsServiceMonitor = "loom-metrics"
	o.MetricsScrapeInterval = "30s"
}

// metricsService is the chart's manager metrics Service (not Loom's own:
// the manager's cache does not hold it), created once.
func metricsService(t *testing.T) *corev1.Service {
	t.Helper()
	if err := env.CreateNamespace(ctx(), loomNS); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: key(loomNS, "loom-metrics")}
	svc.Labels = map[string]string{"app.kubernetes.io/managed-by": "Helm", gpuv1alpha1.LabelComponent: "manager"}
	svc.Spec.Ports = []corev1.ServicePort{{Name: ManagerMetricsPortName, Port: 8443}}
	if err := env.Client.Create(ctx(), svc); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx(), client.ObjectKeyFromObject(svc), svc); err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestManagerServiceMonitorSelected: the manager's own metrics, which the
// GPU alerts are built on, are scraped with nothing configured: Loom writes
// a ServiceMonitor for its metrics Service (HTTPS, Prometheus's token) with
// the labels learned from a kube-prometheus-stack Prometheus, owned by the
// Service, and the policy's condition names the Prometheus that selects
// it.
func TestManagerServiceMonitorSelected(t *testing.T) {
	withOperatorCRDs(t)
	svc := metricsService(t)
	startManager(t, managerMetrics)
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	createProm(t, "monitoring", "kps", kpsSpec("kps"))

	c := policyCondition(t, cp, ReasonSelected)
	if want := "ServiceMonitor loom-system/loom-manager-metrics selected by Prometheus monitoring/kps"; !strings.Contains(c.Message, want) {
		t.Errorf("message %q lacks %q", c.Message, want)
	}
	sm := &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ManagerServiceMonitorName)}
	exists(t, sm)
	ownedBy(t, sm, svc)
	if sm.Labels["release"] != "kps" || sm.Labels[gpuv1alpha1.LabelComponent] != "manager" {
		t.Errorf("labels %v", sm.Labels)
	}
	want := ManagerServiceMonitor(loomNS, ManagerScrape{Service: "loom-metrics", Interval: "30s", Secure: true}, nil)
	if !apiequality.Semantic.DeepEqual(sm.Spec, want.Spec) {
		t.Errorf("spec\n%+v\nwant\n%+v", sm.Spec, want.Spec)
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != "https-metrics" || string(*ep.Scheme) != "https" || ep.BearerTokenFile == "" || ep.Interval != "30s" || //nolint:staticcheck // the chart's scrape
		!*ep.TLSConfig.InsecureSkipVerify || sm.Spec.Selector.MatchLabels[gpuv1alpha1.LabelComponent] != "manager" ||
		ep.RelabelConfigs[0].Regex != "loom-metrics" || ep.RelabelConfigs[0].Action != "keep" {
		t.Errorf("endpoint %+v selector %v", ep, sm.Spec.Selector)
	}
	// Deleted: restored.
	if err := env.Client.Delete(ctx(), sm); err != nil {
		t.Fatal(err)
	}
	exists(t, &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ManagerServiceMonitorName)})
}

// TestManagerServiceMonitorWithoutPolicy: Loom run for TrainingJobs and
// Ray only, with no ClusterPolicy, has its metrics scraped too (the
// manager's alerts read them).
func TestManagerServiceMonitorWithoutPolicy(t *testing.T) {
	withOperatorCRDs(t)
	svc := metricsService(t)
	startManager(t, managerMetrics)
	createProm(t, "monitoring", "kps", kpsSpec("kps"))
	sm := &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ManagerServiceMonitorName)}
	exists(t, sm)
	ownedBy(t, sm, svc)
}

// TestManagerServiceMonitorTurnedOff: without a metrics Service to scrape
// (the chart's metrics.serviceMonitor.enabled false, or true: the chart's
// own), Loom writes no ServiceMonitor for the manager nor names one, and
// removes the one it wrote before.
func TestManagerServiceMonitorTurnedOff(t *testing.T) {
	withOperatorCRDs(t)
	earlier := ManagerServiceMonitor(loomNS, ManagerScrape{Service: "loom-metrics"}, nil)
	earlier.Labels["app.kubernetes.io/managed-by"] = "loom"
	if err := env.CreateNamespace(ctx(), loomNS); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx(), earlier); err != nil {
		t.Fatal(err)
	}
	startManager(t)
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	createProm(t, "monitoring", "kps", kpsSpec("kps"))
	c := policyCondition(t, cp, ReasonSelected)
	exists(t, &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ExporterName)})
	if strings.Contains(c.Message, ManagerServiceMonitorName) {
		t.Errorf("message %q names the manager's ServiceMonitor", c.Message)
	}
	gone(t, &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ManagerServiceMonitorName)})
}

// readLog is a client that records the kinds it is asked to read.
type readLog struct {
	client.Client
	kinds []string
}

func (r *readLog) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	gvk, _ := apiutil.GVKForObject(obj, r.Scheme())
	r.kinds = append(r.kinds, gvk.Kind)
	return r.Client.Get(ctx, key, obj, opts...)
}

// With no ClusterPolicy, no manager ServiceMonitor asked for and no
// Prometheus Operator installed, a pass reads no ServiceMonitor: the
// manager's cache cannot serve a kind whose CRD is absent, and would ask
// the API server's discovery on each pass.
func TestNoPolicyNoOperatorReadsNoServiceMonitor(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{gpuv1alpha1.AddToScheme, monitoringv1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c := &readLog{Client: fake.NewClientBuilder().WithScheme(scheme).Build()}
	r := &GPUReconciler{Client: c, Namespace: loomNS}
	r.crds = operatorCRDs{crdKind("servicemonitors", monitoringv1.SchemeGroupVersion.WithKind(KindServiceMonitor), nil)}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{}); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(c.kinds, KindServiceMonitor) {
		t.Errorf("a pass without the ServiceMonitor CRD read a ServiceMonitor (reads: %v)", c.kinds)
	}
}

// A manager started without the monitoring controller (--controllers
// leaving it out, after a run with it) deletes the manager's ServiceMonitor
// the controller wrote: nothing else would, and the chart then renders its
// own. A ServiceMonitor of that name that is not Loom's stays.
func TestManagerServiceMonitorGoesWithTheController(t *testing.T) {
	withOperatorCRDs(t)
	if err := env.CreateNamespace(ctx(), loomNS); err != nil {
		t.Fatal(err)
	}
	start := func() *testenv.Manager {
		reg := &manager.Registry{}
		reg.Add("monitoring", Setup)
		reg.AddOff("monitoring", Off)
		reg.Add("other", func(context.Context, ctrl.Manager, manager.Options) error { return nil })
		opts := testenv.ManagerOptions(t)
		opts.LeaderElect = false
		opts.Controllers = "other"
		return env.StartManager(t, opts, reg)
	}
	mine := ManagerServiceMonitor(loomNS, ManagerScrape{Service: "loom-metrics"}, nil)
	mine.Labels["app.kubernetes.io/managed-by"] = "loom"
	if err := env.Client.Create(ctx(), mine); err != nil {
		t.Fatal(err)
	}
	m := start()
	gone(t, &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ManagerServiceMonitorName)})
	_ = m.Stop()

	someones := ManagerServiceMonitor(loomNS, ManagerScrape{Service: "loom-metrics"}, nil)
	someones.Labels["app.kubernetes.io/managed-by"] = "Helm"
	if err := env.Client.Create(ctx(), someones); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), someones) })
	m = start()
	time.Sleep(2 * time.Second) // the removal runs once, at start
	_ = m.Stop()
	exists(t, &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ManagerServiceMonitorName)})
}

// TestManagerServiceMonitorFileAccessDenied: a Prometheus with
// arbitraryFSAccessThroughSMs.deny selects the manager's ServiceMonitor by
// its labels, but the Prometheus Operator rejects it for its
// bearerTokenFile: the condition says so instead of Selected, while
// dcgm-exporter's ServiceMonitor, which reads no file, is selected.
func TestManagerServiceMonitorFileAccessDenied(t *testing.T) {
	withOperatorCRDs(t)
	metricsService(t)
	startManager(t, managerMetrics)
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	spec := kpsSpec("kps")
	spec.ArbitraryFSAccessThroughSMs.Deny = true
	createProm(t, "monitoring", "kps", spec)

	c := policyCondition(t, cp, ReasonNotSelected)
	for _, want := range []string{
		"no Prometheus selects ServiceMonitor loom-system/loom-manager-metrics (Prometheus monitoring/kps: its arbitraryFSAccessThroughSMs.deny rejects",
		"ServiceMonitor loom-system/loom-dcgm-exporter selected by Prometheus monitoring/kps",
	} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q lacks %q", c.Message, want)
		}
	}
}
