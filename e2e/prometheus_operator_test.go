package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/e2e/framework"
)

var promOperator struct {
	once sync.Once
	proc *framework.Process
	err  error
}

// prometheusOperator starts the real Prometheus Operator on the package's
// cluster the first time it is called; later tests share that process (the
// cluster stops it). Tests check what it selects by reading the config it
// generates: cluster.PrometheusConfig and cluster.PrometheusRuleFiles.
func prometheusOperator(t *testing.T) *framework.Process {
	t.Helper()
	promOperator.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		promOperator.proc, promOperator.err = cluster.StartPrometheusOperator(ctx)
	})
	if promOperator.err != nil {
		t.Fatalf("starting the Prometheus Operator: %v", promOperator.err)
	}
	if exited, err := promOperator.proc.Exited(); exited {
		t.Fatalf("the Prometheus Operator exited (%v):\n%s", err, promOperator.proc.Tail(4000))
	}
	return promOperator.proc
}

// The harness itself: the operator selects ServiceMonitors, PodMonitors and
// PrometheusRules by the Prometheus object's label selectors, and the
// generated config and rule files show which it picked.
func TestPrometheusOperatorHarness(t *testing.T) {
	prometheusOperator(t)
	ctx := context.Background()
	const ns = "prom-harness"
	if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	release := map[string]string{"release": "kps"}
	all := &metav1.LabelSelector{}
	prom := &monitoringv1.Prometheus{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kps"},
		Spec: monitoringv1.PrometheusSpec{
			CommonPrometheusFields: monitoringv1.CommonPrometheusFields{
				ServiceMonitorSelector:          &metav1.LabelSelector{MatchLabels: release},
				ServiceMonitorNamespaceSelector: all,
				PodMonitorSelector:              &metav1.LabelSelector{MatchLabels: release},
				PodMonitorNamespaceSelector:     all,
			},
			RuleSelector:          &metav1.LabelSelector{MatchLabels: release},
			RuleNamespaceSelector: all,
		},
	}
	endpoint := monitoringv1.Endpoint{Port: "metrics"}
	selected := &monitoringv1.ServiceMonitor{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "selected", Labels: release},
		Spec: monitoringv1.ServiceMonitorSpec{
			Selector:  metav1.LabelSelector{MatchLabels: map[string]string{"app": "selected"}},
			Endpoints: []monitoringv1.Endpoint{endpoint},
		},
	}
	unlabelled := &monitoringv1.ServiceMonitor{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unlabelled"},
		Spec: monitoringv1.ServiceMonitorSpec{
			Selector:  metav1.LabelSelector{MatchLabels: map[string]string{"app": "unlabelled"}},
			Endpoints: []monitoringv1.Endpoint{endpoint},
		},
	}
	pods := &monitoringv1.PodMonitor{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods", Labels: release},
		Spec: monitoringv1.PodMonitorSpec{
			Selector:            metav1.LabelSelector{MatchLabels: map[string]string{"app": "pods"}},
			PodMetricsEndpoints: []monitoringv1.PodMetricsEndpoint{{Port: ptr.To("metrics")}},
		},
	}
	rules := &monitoringv1.PrometheusRule{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rules", Labels: release},
		Spec: monitoringv1.PrometheusRuleSpec{Groups: []monitoringv1.RuleGroup{{
			Name:  "harness",
			Rules: []monitoringv1.Rule{{Alert: "HarnessAlert", Expr: intstr.FromString("vector(1) > 0")}},
		}}},
	}
	// The unlabelled ServiceMonitor goes first, so that the config which shows
	// the later objects was generated after the operator saw it.
	for _, o := range []client.Object{unlabelled, prom, selected, pods, rules} {
		if err := cluster.Client.Create(ctx, o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
		t.Cleanup(func() { _ = cluster.Client.Delete(context.Background(), o) })
	}

	wantJobs := []string{"serviceMonitor/" + ns + "/selected/0", "podMonitor/" + ns + "/pods/0"}
	cfg, err := cluster.PrometheusConfig(ctx, ns, prom.Name, 2*time.Minute, func(cfg string) bool {
		for _, job := range wantJobs {
			if !strings.Contains(cfg, "job_name: "+job+"\n") {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("%v\nlast config:\n%s", err, cfg)
	}
	if strings.Contains(cfg, "serviceMonitor/"+ns+"/unlabelled/") {
		t.Errorf("the ServiceMonitor without release=kps was selected:\n%s", cfg)
	}

	files, err := cluster.PrometheusRuleFiles(ctx, ns, prom.Name, 2*time.Minute, func(files map[string]string) bool {
		for name, content := range files {
			if strings.HasPrefix(name, ns+"-rules-") && strings.Contains(content, "alert: HarnessAlert") {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("%v\nrule files: %v", err, files)
	}
}
