package monitoring

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	monitoringv1alpha1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/controllers/monitoring/assets"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

// The Prometheus Operator's CRDs are left out: the first test watches Loom
// wait for them and onboard when they are installed.
func TestMain(m *testing.M) { testenv.MainWithout(m, &env, "monitoring.coreos.com") }

var installCRDs sync.Once

// withOperatorCRDs installs the Prometheus Operator CRDs (once).
func withOperatorCRDs(t *testing.T) {
	t.Helper()
	var err error
	installCRDs.Do(func() { err = env.InstallCRDs(context.Background(), "monitoring.coreos.com") })
	if err != nil {
		t.Fatal(err)
	}
}

func startManager(t *testing.T, mutate ...func(*manager.Options)) *testenv.Manager {
	t.Helper()
	reg := &manager.Registry{}
	reg.Add("monitoring", Setup)
	opts := testenv.ManagerOptions(t)
	opts.LeaderElect = false
	for _, m := range mutate {
		m(&opts)
	}
	// Registered before the manager's own cleanup, so it runs after the
	// manager has stopped: a child removed while the manager still runs
	// would be created again, owned by this test's policy, and the next test
	// would meet it as another owner's object.
	t.Cleanup(removeGPUChildren)
	return env.StartManager(t, opts, reg)
}

// removeGPUChildren deletes the children of the ClusterPolicy: no garbage
// collector runs under envtest.
func removeGPUChildren() {
	for _, o := range []client.Object{
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: ExporterName}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: CountersConfigMap}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: DashboardsConfigMap}},
		&monitoringv1.ServiceMonitor{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: ExporterName}},
		&monitoringv1.ServiceMonitor{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: ManagerServiceMonitorName}},
		&monitoringv1.PrometheusRule{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: RuleName}},
		&monitoringv1.PodMonitor{ObjectMeta: metav1.ObjectMeta{Namespace: loomNS, Name: NodeAgentPodMonitorName}},
	} {
		_ = env.Client.Delete(ctx(), o)
	}
}

const loomNS = "loom-system"

func ctx() context.Context { return context.Background() }

func createPolicy(t *testing.T, spec gpuv1alpha1.ClusterPolicySpec) *gpuv1alpha1.ClusterPolicy {
	t.Helper()
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cluster-policy"}, Spec: spec}
	if err := env.Client.Create(ctx(), cp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx(), cp) })
	return cp
}

// condition waits until obj's condition of type ct has reason, and returns
// it.
func condition(t *testing.T, obj client.Object, ct, reason string, conds func() []metav1.Condition) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := env.Client.Get(ctx(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		c := meta.FindStatusCondition(conds(), ct)
		if c == nil || c.Reason != reason {
			return fmt.Errorf("condition %s is %+v, want reason %s", ct, c, reason)
		}
		got = *c
		return nil
	})
	return got
}

func policyCondition(t *testing.T, cp *gpuv1alpha1.ClusterPolicy, reason string) metav1.Condition {
	t.Helper()
	return condition(t, cp, ConditionMonitoring, reason, func() []metav1.Condition { return cp.Status.Conditions })
}

func exists(t *testing.T, obj client.Object) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() error { return env.Client.Get(ctx(), client.ObjectKeyFromObject(obj), obj) })
}

func gone(t *testing.T, obj client.Object) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() error {
		err := env.Client.Get(ctx(), client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil && obj.GetDeletionTimestamp() != nil {
			return nil
		}
		return fmt.Errorf("%s %s still exists (%v)", fmt.Sprintf("%T", obj), obj.GetName(), err)
	})
}

func ownedBy(t *testing.T, obj client.Object, owner client.Object) {
	t.Helper()
	if ref := metav1.GetControllerOf(obj); ref == nil || ref.UID != owner.GetUID() {
		t.Errorf("%T %s: controller %+v, want %s", obj, obj.GetName(), ref, owner.GetName())
	}
}

func key(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }

// TestOnboardsWhenTheOperatorArrives: without the Prometheus Operator's CRDs
// the policy says monitoring waits for it while the Service, counters and
// dashboards are in place. Each kind follows its own CRD within seconds,
// without a restart: with the monitor CRDs only (Grafana Alloy,
// VictoriaMetrics' converter) the ServiceMonitor and PodMonitors are
// written, and the condition says there are no rules and no Prometheus to
// check them against; the rules follow their CRD.
func TestOnboardsWhenTheOperatorArrives(t *testing.T) {
	metricsService(t)
	startManager(t, managerMetrics)
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	c := policyCondition(t, cp, ReasonOperatorMissing)
	if !strings.Contains(c.Message, "servicemonitors.monitoring.coreos.com") || c.Status != metav1.ConditionFalse {
		t.Errorf("condition %+v does not name the missing CRD", c)
	}
	svc := &corev1.Service{ObjectMeta: key(loomNS, ExporterName)}
	counters := &corev1.ConfigMap{ObjectMeta: key(loomNS, CountersConfigMap)}
	dashboards := &corev1.ConfigMap{ObjectMeta: key(loomNS, DashboardsConfigMap)}
	for _, o := range []client.Object{svc, counters, dashboards} {
		exists(t, o)
		ownedBy(t, o, cp)
	}
	if p := svc.Spec.Ports; len(p) != 1 || p[0].Name != "gpu-metrics" || p[0].Port != 9400 || p[0].TargetPort.StrVal != "gpu-metrics" {
		t.Errorf("service ports %+v", p)
	}
	if svc.Spec.Selector[gpuv1alpha1.LabelComponent] != gpuv1alpha1.OperandDCGMExporter || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("service spec %+v", svc.Spec)
	}
	if counters.Data[assets.DCGMMetricsKey] != assets.DCGMMetricsCSV || !strings.Contains(counters.Data[assets.DCGMMetricsKey], "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") {
		t.Errorf("counters ConfigMap lacks Loom's CSV with the ECC fields")
	}
	if dashboards.Labels["grafana_dashboard"] != "1" || len(dashboards.Data) < 2 {
		t.Errorf("dashboards ConfigMap labels %v, %d dashboards", dashboards.Labels, len(dashboards.Data))
	}

	if err := env.InstallCRDsNamed(ctx(), "servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com"); err != nil {
		t.Fatal(err)
	}
	sm := &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ExporterName)}
	exists(t, sm)
	exists(t, &monitoringv1.PodMonitor{ObjectMeta: key(loomNS, NodeAgentPodMonitorName)})
	// The manager's own metrics too, which the alerts are built on.
	exists(t, &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ManagerServiceMonitorName)})
	c = policyCondition(t, cp, ReasonWritten)
	for _, want := range []string{"no PrometheusRule CRD (prometheusrules.monitoring.coreos.com) is installed, so Loom's GPU alerts and recording rules are not written",
		"ServiceMonitor loom-system/loom-dcgm-exporter, ServiceMonitor loom-system/loom-manager-metrics, PodMonitor loom-system/loom-node-agent written; no Prometheus CRD is installed"} {
		if !strings.Contains(c.Message, want) || c.Status != metav1.ConditionTrue {
			t.Errorf("condition %s %q lacks %q", c.Status, c.Message, want)
		}
	}
	if err := env.CreateNamespace(ctx(), "monitorsonly"); err != nil {
		t.Fatal(err)
	}
	job := trainingJob("monitorsonly", "bert", true)
	if err := env.Client.Create(ctx(), job); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx(), job) })
	jobConds := func() []metav1.Condition { return job.Status.Conditions }
	condition(t, job, ConditionMonitoring, ReasonWritten, jobConds)
	exists(t, &monitoringv1.PodMonitor{ObjectMeta: key("monitorsonly", TrainingJobPodMonitorName("bert"))})

	installed := time.Now()
	withOperatorCRDs(t)
	rule := &monitoringv1.PrometheusRule{ObjectMeta: key(loomNS, RuleName)}
	exists(t, rule)
	t.Logf("rules written %.1fs after their CRD was installed", time.Since(installed).Seconds())
	c = policyCondition(t, cp, ReasonNoPrometheus)
	// The Prometheus CRD, installed later too, is read for the job.
	condition(t, job, ConditionMonitoring, ReasonNoPrometheus, jobConds)
	if !strings.Contains(c.Message, "ServiceMonitor loom-system/loom-dcgm-exporter") {
		t.Errorf("message %q", c.Message)
	}
	if want := ExporterServiceMonitor(loomNS, nil); !apiequality.Semantic.DeepEqual(sm.Spec, want.Spec) {
		t.Errorf("ServiceMonitor spec\n%+v\nwant\n%+v", sm.Spec, want.Spec)
	}
	if want := GPURule(loomNS, nil); !apiequality.Semantic.DeepEqual(rule.Spec, want.Spec) {
		t.Errorf("PrometheusRule spec differs from assets.GPURules()")
	}
	ownedBy(t, sm, cp)
	ownedBy(t, rule, cp)
	// The node agent's own metrics: a PodMonitor for its pods' "metrics"
	// port, beside dcgm-exporter's ServiceMonitor.
	agent := &monitoringv1.PodMonitor{ObjectMeta: key(loomNS, NodeAgentPodMonitorName)}
	exists(t, agent)
	ownedBy(t, agent, cp)
	if want := NodeAgentPodMonitor(loomNS, nil); !apiequality.Semantic.DeepEqual(agent.Spec, want.Spec) {
		t.Errorf("node agent PodMonitor spec\n%+v\nwant\n%+v", agent.Spec, want.Spec)
	}
	if sel := agent.Spec.Selector.MatchLabels; len(sel) != 1 || sel["app.kubernetes.io/component"] != "node-agent" ||
		*agent.Spec.PodMetricsEndpoints[0].Port != "metrics" || agent.Spec.NamespaceSelector.MatchNames[0] != loomNS {
		t.Errorf("node agent PodMonitor selects %v port %s in %v", sel, *agent.Spec.PodMetricsEndpoints[0].Port, agent.Spec.NamespaceSelector)
	}
	if !strings.Contains(c.Message, "PodMonitor loom-system/loom-node-agent") {
		t.Errorf("message %q does not name the node agent's PodMonitor", c.Message)
	}
}

func createProm(t *testing.T, ns, name string, spec monitoringv1.PrometheusSpec) *monitoringv1.Prometheus {
	t.Helper()
	if err := env.CreateNamespace(ctx(), ns); err != nil {
		t.Fatal(err)
	}
	p := &monitoringv1.Prometheus{ObjectMeta: key(ns, name), Spec: spec}
	if err := env.Client.Create(ctx(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx(), p) })
	return p
}

// TestSelectedByPrometheus: a kube-prometheus-stack style Prometheus
// (release: kps) selects Loom's monitors because Loom learns the label; the
// condition names it. A Prometheus whose selector cannot be learned is
// reported with what it lacks. Deleted children come back; disabling
// dcgm-exporter removes its Service, counters and ServiceMonitor.
func TestSelectedByPrometheus(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t)
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	createProm(t, "monitoring", "kps", kpsSpec("kps"))

	c := policyCondition(t, cp, ReasonSelected)
	for _, want := range []string{"ServiceMonitor loom-system/loom-dcgm-exporter selected by Prometheus monitoring/kps",
		"PrometheusRule loom-system/loom-gpu selected by Prometheus monitoring/kps", "labels release=kps learned from Prometheus monitoring/kps",
		"PodMonitor loom-system/loom-node-agent selected by Prometheus monitoring/kps"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q lacks %q", c.Message, want)
		}
	}
	sm := &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ExporterName)}
	rule := &monitoringv1.PrometheusRule{ObjectMeta: key(loomNS, RuleName)}
	agent := &monitoringv1.PodMonitor{ObjectMeta: key(loomNS, NodeAgentPodMonitorName)}
	for _, o := range []client.Object{sm, rule, agent} {
		exists(t, o)
		if o.GetLabels()["release"] != "kps" {
			t.Errorf("%T labels %v lack release=kps", o, o.GetLabels())
		}
	}

	restoredAfterHandEdits(t, sm, rule)

	// A second Prometheus with an expression selector in its own namespace:
	// reported, while kps still selects.
	other := kpsSpec("x")
	other.ServiceMonitorSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"gpu"}}}}
	other.ServiceMonitorNamespaceSelector = nil
	createProm(t, "team-gpu", "gpu", other)
	testenv.Eventually(t, 20*time.Second, func() error {
		c := policyCondition(t, cp, ReasonSelected)
		if !strings.Contains(c.Message, "monitoring/kps") {
			return fmt.Errorf("message %q", c.Message)
		}
		return nil
	})

	// dcgm-exporter disabled: its Service, counters and ServiceMonitor go;
	// the rules stay.
	if err := env.Client.Get(ctx(), client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Patch(ctx(), cp, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"dcgmExporter":{"enabled":false}}}`))); err != nil {
		t.Fatal(err)
	}
	gone(t, &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ExporterName)})
	gone(t, &corev1.Service{ObjectMeta: key(loomNS, ExporterName)})
	gone(t, &corev1.ConfigMap{ObjectMeta: key(loomNS, CountersConfigMap)})
	exists(t, &monitoringv1.PrometheusRule{ObjectMeta: key(loomNS, RuleName)})
	c = policyCondition(t, cp, ReasonExporterDisabled)
	if c.Status != metav1.ConditionFalse {
		t.Errorf("condition %+v", c)
	}
}

// TestPrometheusAgentSelects: in a cluster whose only Prometheus is a
// PrometheusAgent (scraping, and remote-writing elsewhere), the agent's
// selector is learned for the monitors and the condition names it; it says
// that no agent evaluates the rules, until a Prometheus selects them.
func TestPrometheusAgentSelects(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t)
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	if err := env.CreateNamespace(ctx(), "monitoring"); err != nil {
		t.Fatal(err)
	}
	agent := &monitoringv1alpha1.PrometheusAgent{ObjectMeta: key("monitoring", "agent"),
		Spec: monitoringv1alpha1.PrometheusAgentSpec{CommonPrometheusFields: kpsSpec("agent").CommonPrometheusFields}}
	if err := env.Client.Create(ctx(), agent); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx(), agent) })

	c := policyCondition(t, cp, ReasonSelected)
	for _, want := range []string{"ServiceMonitor loom-system/loom-dcgm-exporter selected by PrometheusAgent monitoring/agent",
		"labels release=agent learned from PrometheusAgent monitoring/agent",
		"PodMonitor loom-system/loom-node-agent selected by PrometheusAgent monitoring/agent",
		"PrometheusRule loom-system/loom-gpu written, but no Prometheus evaluates it: only PrometheusAgent monitoring/agent, and an agent evaluates no rules"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q lacks %q", c.Message, want)
		}
	}
	sm := &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ExporterName)}
	exists(t, sm)
	if sm.Labels["release"] != "agent" {
		t.Errorf("ServiceMonitor labels %v lack release=agent", sm.Labels)
	}

	// A Prometheus for the rules beside the agent: it selects them.
	createProm(t, "monitoring", "rules", kpsSpec("agent"))
	testenv.Eventually(t, 20*time.Second, func() error {
		c := policyCondition(t, cp, ReasonSelected)
		if !strings.Contains(c.Message, "PrometheusRule loom-system/loom-gpu selected by Prometheus monitoring/rules") {
			return fmt.Errorf("message %q", c.Message)
		}
		return nil
	})
}

// restoredAfterHandEdits: the GPU children, deleted by hand, come back, and
// the ServiceMonitor's spec, edited by hand, is restored.
func restoredAfterHandEdits(t *testing.T, sm *monitoringv1.ServiceMonitor, rule *monitoringv1.PrometheusRule) {
	t.Helper()
	// Deleted by hand: restored.
	for _, o := range []client.Object{sm, rule, &corev1.Service{ObjectMeta: key(loomNS, ExporterName)}, &corev1.ConfigMap{ObjectMeta: key(loomNS, CountersConfigMap)}} {
		if err := env.Client.Get(ctx(), client.ObjectKeyFromObject(o), o); err != nil {
			t.Fatal(err)
		}
		uid := o.GetUID()
		if err := env.Client.Delete(ctx(), o); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, func() error {
			if err := env.Client.Get(ctx(), client.ObjectKeyFromObject(o), o); err != nil {
				return err
			}
			if o.GetUID() == uid {
				return errors.New("not recreated yet")
			}
			return nil
		})
	}
	// Edited by hand: restored.
	edited := sm.DeepCopy()
	edited.Spec.Endpoints[0].Port = "metrics"
	if err := env.Client.Update(ctx(), edited); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := env.Client.Get(ctx(), client.ObjectKeyFromObject(sm), sm); err != nil {
			return err
		}
		if p := sm.Spec.Endpoints[0].Port; p != "gpu-metrics" {
			return fmt.Errorf("port %q", p)
		}
		return nil
	})
}

// TestMismatchedPrometheusIsReported: with configured labels that the only
// Prometheus does not select, the condition names the label it needs.
func TestMismatchedPrometheusIsReported(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t, func(o *manager.Options) { o.MonitoringLabels = map[string]string{"release": "prom"} })
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	createProm(t, "monitoring", "kps", kpsSpec("kps"))
	c := policyCondition(t, cp, ReasonNotSelected)
	for _, want := range []string{"no Prometheus selects ServiceMonitor loom-system/loom-dcgm-exporter",
		"Prometheus monitoring/kps: serviceMonitorSelector {release=kps} needs label release=kps"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q lacks %q", c.Message, want)
		}
	}
	sm := &monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ExporterName)}
	exists(t, sm)
	if sm.Labels["release"] != "prom" {
		t.Errorf("labels %v: the configured label must be kept", sm.Labels)
	}
}

func trainingJob(ns, name string, metricsPort bool) *trainingv1alpha1.TrainingJob {
	tmpl := corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "pytorch", Image: "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}}}}
	if metricsPort {
		tmpl.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}}
	}
	workers := int32(1)
	return &trainingv1alpha1.TrainingJob{
		ObjectMeta: key(ns, name),
		Spec: trainingv1alpha1.TrainingJobSpec{ReplicaSpecs: trainingv1alpha1.ReplicaSpecs{
			Master: trainingv1alpha1.ReplicaSpec{Template: tmpl},
			Worker: &trainingv1alpha1.ReplicaSpec{Replicas: &workers, Template: tmpl},
		}},
	}
}

// TestWorkloadPodMonitors: a TrainingJob with a metrics port and a
// RayCluster get a PodMonitor, owned, with the learned label, and a
// condition naming the Prometheus; a job without a port says so; the
// opt-out annotation removes the PodMonitor.
func TestWorkloadPodMonitors(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t)
	createProm(t, "monitoring", "kps", kpsSpec("kps"))
	if err := env.CreateNamespace(ctx(), "ml"); err != nil {
		t.Fatal(err)
	}

	job := trainingJob("ml", "bert", true)
	if err := env.Client.Create(ctx(), job); err != nil {
		t.Fatal(err)
	}
	jobConds := func() []metav1.Condition { return job.Status.Conditions }
	c := condition(t, job, ConditionMonitoring, ReasonSelected, jobConds)
	if !strings.Contains(c.Message, "PodMonitor ml/loom-trainingjob-bert selected by Prometheus monitoring/kps") {
		t.Errorf("message %q", c.Message)
	}
	pm := &monitoringv1.PodMonitor{ObjectMeta: key("ml", "loom-trainingjob-bert")}
	exists(t, pm)
	ownedBy(t, pm, job)
	if want := TrainingJobPodMonitor(job, nil); !apiequality.Semantic.DeepEqual(pm.Spec, want.Spec) || pm.Labels["release"] != "kps" {
		t.Errorf("PodMonitor %+v %v", pm.Spec, pm.Labels)
	}
	if got := pm.Spec.Selector.MatchLabels["training.loom.dev/job-name"]; got != "bert" {
		t.Errorf("selector %v", pm.Spec.Selector)
	}

	// Opt out: the PodMonitor goes and the condition says why.
	if err := env.Client.Patch(ctx(), job, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"monitoring.loom.dev/scrape":"false"}}}`))); err != nil {
		t.Fatal(err)
	}
	gone(t, pm)
	condition(t, job, ConditionMonitoring, ReasonOptedOut, jobConds)

	plain := trainingJob("ml", "plain", false)
	if err := env.Client.Create(ctx(), plain); err != nil {
		t.Fatal(err)
	}
	condition(t, plain, ConditionMonitoring, ReasonNoMetricsPort, func() []metav1.Condition { return plain.Status.Conditions })
	if err := env.Client.Get(ctx(), client.ObjectKey{Namespace: "ml", Name: "loom-trainingjob-plain"}, &monitoringv1.PodMonitor{}); !apierrors.IsNotFound(err) {
		t.Errorf("a job without a metrics port got a PodMonitor (%v)", err)
	}

	rc, err := testenv.KubeRaySample("ray-cluster.sample.yaml", "ml")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx(), rc); err != nil {
		t.Fatal(err)
	}
	condition(t, rc, RayConditionMonitoring, ReasonSelected, func() []metav1.Condition { return rc.Status.Conditions })
	rpm := &monitoringv1.PodMonitor{ObjectMeta: key("ml", RayClusterPodMonitorName(rc.Name))}
	exists(t, rpm)
	ownedBy(t, rpm, rc)
	if rpm.Spec.Selector.MatchLabels["ray.io/cluster"] != rc.Name || *rpm.Spec.PodMetricsEndpoints[0].Port != "metrics" {
		t.Errorf("Ray PodMonitor %+v", rpm.Spec)
	}
}

// writes sums the manager's non-read API requests by verb/resource.
func writes(t *testing.T) map[string]float64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "loom_api_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if v := l["verb"]; v != "get" && v != "list" && v != "watch" {
				out[v+" "+l["resource"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestSteadyStateWritesNothing: once onboarded, reconciles triggered by
// unrelated changes compare with the cache and write nothing.
func TestSteadyStateWritesNothing(t *testing.T) {
	withOperatorCRDs(t)
	metricsService(t)
	startManager(t, managerMetrics)
	createProm(t, "monitoring", "kps", kpsSpec("kps"))
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	if err := env.CreateNamespace(ctx(), "steady"); err != nil {
		t.Fatal(err)
	}
	job := trainingJob("steady", "bert", true)
	if err := env.Client.Create(ctx(), job); err != nil {
		t.Fatal(err)
	}
	policyCondition(t, cp, ReasonSelected)
	condition(t, job, ConditionMonitoring, ReasonSelected, func() []metav1.Condition { return job.Status.Conditions })
	time.Sleep(time.Second)
	before := writes(t)
	// A child the cache does not show is created (a POST), then applied.
	if before["apply podmonitors"]+before["create podmonitors"] == 0 || before["apply prometheusrules"]+before["create prometheusrules"] == 0 {
		t.Fatalf("the request counter saw no writes while onboarding: %v", before)
	}
	for _, o := range []client.Object{cp, job} {
		if err := env.Client.Patch(ctx(), o, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"touched":"1"}}}`))); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * time.Second)
	after := writes(t)
	for k, v := range after {
		if d := v - before[k]; d != 0 && !strings.Contains(k, "leases") {
			t.Errorf("steady state wrote %s ×%v", k, d)
		}
	}
}

// TestNamespaceLabelsAreWatched: a Prometheus that reads PodMonitors only
// from namespaces labelled team=ml selects a job's PodMonitor once its
// namespace gets the label, and the condition follows.
func TestNamespaceLabelsAreWatched(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t)
	spec := kpsSpec("kps")
	spec.PodMonitorNamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}}
	createProm(t, "monitoring", "kps", spec)
	if err := env.CreateNamespace(ctx(), "nslabels"); err != nil {
		t.Fatal(err)
	}
	job := trainingJob("nslabels", "bert", true)
	if err := env.Client.Create(ctx(), job); err != nil {
		t.Fatal(err)
	}
	conds := func() []metav1.Condition { return job.Status.Conditions }
	c := condition(t, job, ConditionMonitoring, ReasonNotSelected, conds)
	if !strings.Contains(c.Message, "podMonitorNamespaceSelector {team=ml} does not select namespace nslabels") {
		t.Errorf("message %q", c.Message)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nslabels"}}
	if err := env.Client.Patch(ctx(), ns, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"ml"}}}`))); err != nil {
		t.Fatal(err)
	}
	condition(t, job, ConditionMonitoring, ReasonSelected, conds)
}

// monitoringCondition waits for the job's Monitoring condition to satisfy
// ok, and returns it.
func monitoringCondition(t *testing.T, job *trainingv1alpha1.TrainingJob, ok func(*metav1.Condition) error) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	testenv.Eventually(t, 20*time.Second, func() error {
		if err := env.Client.Get(ctx(), client.ObjectKeyFromObject(job), job); err != nil {
			return err
		}
		if c = meta.FindStatusCondition(job.Status.Conditions, ConditionMonitoring); c == nil {
			return fmt.Errorf("no %s condition: %+v", ConditionMonitoring, job.Status.Conditions)
		}
		return ok(c)
	})
	return c
}

// A PodMonitor the API server refuses (here a quota of none in the
// namespace) is retried, and the job's condition says why meanwhile.
func TestRefusedPodMonitorIsInTheCondition(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t)
	createProm(t, "monitoring", "kps", kpsSpec("kps"))
	if err := env.CreateNamespace(ctx(), "quota"); err != nil {
		t.Fatal(err)
	}
	const podMonitors = "count/podmonitors.monitoring.coreos.com"
	q := &corev1.ResourceQuota{ObjectMeta: key("quota", "no-monitors"), Spec: corev1.ResourceQuotaSpec{
		Hard: corev1.ResourceList{podMonitors: resource.MustParse("0")}}}
	if err := env.Client.Create(ctx(), q); err != nil {
		t.Fatal(err)
	}
	// No kube-controller-manager here: the quota's usage is set by hand.
	q.Status = corev1.ResourceQuotaStatus{Hard: q.Spec.Hard, Used: corev1.ResourceList{podMonitors: resource.MustParse("0")}}
	if err := env.Client.Status().Update(ctx(), q); err != nil {
		t.Fatal(err)
	}
	job := trainingJob("quota", "bert", true)
	if err := env.Client.Create(ctx(), job); err != nil {
		t.Fatal(err)
	}
	// Gone before the manager stops: no later test's manager retries it.
	t.Cleanup(func() { _ = env.Client.Delete(ctx(), job); _ = env.Client.Delete(ctx(), q) })
	c := monitoringCondition(t, job, func(c *metav1.Condition) error {
		if c.Status != metav1.ConditionFalse || c.Reason != ReasonApplyFailed {
			return fmt.Errorf("condition %s %s: %s", c.Status, c.Reason, c.Message)
		}
		return nil
	})
	t.Logf("%s: %s", c.Reason, c.Message)
}

// Prometheus selectors can be long, and the condition message names them:
// it is cut to what the API takes, and the condition is still written.
func TestLongConditionMessageIsCut(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t)
	if err := env.CreateNamespace(ctx(), "longmsg"); err != nil {
		t.Fatal(err)
	}
	var teams []string
	for i := range 1700 {
		teams = append(teams, fmt.Sprintf("team-%04d", i))
	}
	spec := kpsSpec("kps")
	spec.PodMonitorSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: teams}}}
	createProm(t, "monitoring", "teams", spec)
	job := trainingJob("longmsg", "bert", true)
	if err := env.Client.Create(ctx(), job); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx(), job) })
	monitoringCondition(t, job, func(c *metav1.Condition) error {
		if len(c.Message) > apply.MaxConditionMessage {
			return fmt.Errorf("message of %d bytes", len(c.Message))
		}
		return nil
	})
}

// TestConflictResolvedByRemovingTheUsersObject: the condition tells a
// person that a user's object holds the name of Loom's child and that Loom
// leaves it alone; once they delete it, Loom's child is written, for the
// policy's rules and for a job's PodMonitor alike, without waiting for
// another change.
func TestConflictResolvedByRemovingTheUsersObject(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t)
	createProm(t, "monitoring", "kps", kpsSpec("kps"))
	if err := env.CreateNamespace(ctx(), loomNS); err != nil {
		t.Fatal(err)
	}
	if err := env.CreateNamespace(ctx(), "takenname"); err != nil {
		t.Fatal(err)
	}
	usersRule := &monitoringv1.PrometheusRule{ObjectMeta: key(loomNS, RuleName),
		Spec: monitoringv1.PrometheusRuleSpec{Groups: []monitoringv1.RuleGroup{{Name: "mine"}}}}
	port := "web"
	usersPM := &monitoringv1.PodMonitor{ObjectMeta: key("takenname", TrainingJobPodMonitorName("bert")),
		Spec: monitoringv1.PodMonitorSpec{PodMetricsEndpoints: []monitoringv1.PodMetricsEndpoint{{Port: &port}}}}
	for _, o := range []client.Object{usersRule, usersPM} {
		if err := env.Client.Create(ctx(), o); err != nil {
			t.Fatal(err)
		}
	}
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	job := trainingJob("takenname", "bert", true)
	if err := env.Client.Create(ctx(), job); err != nil {
		t.Fatal(err)
	}
	jobConds := func() []metav1.Condition { return job.Status.Conditions }
	policyCondition(t, cp, ReasonConflict)
	condition(t, job, ConditionMonitoring, ReasonConflict, jobConds)

	// The person does what the condition says: removes their objects.
	for _, o := range []client.Object{usersRule, usersPM} {
		if err := env.Client.Delete(ctx(), o); err != nil {
			t.Fatal(err)
		}
	}
	rule := &monitoringv1.PrometheusRule{ObjectMeta: key(loomNS, RuleName)}
	pm := &monitoringv1.PodMonitor{ObjectMeta: key("takenname", TrainingJobPodMonitorName("bert"))}
	testenv.Eventually(t, 20*time.Second, func() error { return env.Client.Get(ctx(), client.ObjectKeyFromObject(rule), rule) })
	testenv.Eventually(t, 20*time.Second, func() error { return env.Client.Get(ctx(), client.ObjectKeyFromObject(pm), pm) })
	ownedBy(t, rule, cp)
	ownedBy(t, pm, job)
	policyCondition(t, cp, ReasonSelected)
	condition(t, job, ConditionMonitoring, ReasonSelected, jobConds)
}

// TestPrometheusOutsideWatchedNamespaces: with --watch-namespaces naming the
// workloads' namespaces (and Loom's), the Prometheus in namespace
// monitoring is still the one that must select Loom's monitors: its
// selector is learned and the condition names it, rather than claiming
// there is no Prometheus in the cluster.
func TestPrometheusOutsideWatchedNamespaces(t *testing.T) {
	withOperatorCRDs(t)
	startManager(t, func(o *manager.Options) { o.WatchNamespaces = []string{loomNS, "watched"} })
	if err := env.CreateNamespace(ctx(), "watched"); err != nil {
		t.Fatal(err)
	}
	job := trainingJob("watched", "bert", true)
	if err := env.Client.Create(ctx(), job); err != nil {
		t.Fatal(err)
	}
	conds := func() []metav1.Condition { return job.Status.Conditions }
	condition(t, job, ConditionMonitoring, ReasonNoPrometheus, conds)
	// The Prometheus arrives: its watch, outside the watched namespaces
	// too, brings the job's reconcile.
	createProm(t, "monitoring", "kps", kpsSpec("kps"))
	c := condition(t, job, ConditionMonitoring, ReasonSelected, conds)
	if !strings.Contains(c.Message, "selected by Prometheus monitoring/kps") {
		t.Errorf("message %q", c.Message)
	}
}
