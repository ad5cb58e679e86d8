package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/controllers/monitoring"
	"github.com/loom-dev/loom/e2e/framework"
)

// monitoringCondition waits for the Monitoring condition of obj to have
// reason and returns its message.
func monitoringCondition(t *testing.T, obj client.Object, ct, reason string, conds func() []metav1.Condition) string {
	t.Helper()
	var msg string
	eventually(t, 60*time.Second, func() (bool, string) {
		if err := cluster.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(conds(), ct)
		if c == nil {
			return false, "no " + ct + " condition"
		}
		msg = c.Message
		return c.Reason == reason, fmt.Sprintf("%s: %s %s", ct, c.Reason, c.Message)
	})
	return msg
}

// The real Prometheus Operator (v0.85.0) decides what is selected: Loom's
// dcgm-exporter ServiceMonitor, the manager's own (scraped over HTTPS with
// Prometheus's token), GPU rules and workload PodMonitors appear
// in the configuration it generates for a kube-prometheus-stack style
// Prometheus (release: kps), because Loom learned the label; a Prometheus
// that selects other labels gets none of them, and the conditions say so.
func TestMonitoringSelectedByTheRealPrometheusOperator(t *testing.T) {
	prometheusOperator(t)
	ctx := context.Background()
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "mon-gpu", Count: 2, GPUs: 8,
		Labels: map[string]string{"nvidia.com/gpu.present": "true"}}); err != nil {
		t.Fatal(err)
	}
	// As the chart's Deployment runs it: the manager's own metrics Service.
	startLoomManager(t, "--metrics-service-monitor=loom-metrics", "--metrics-scrape-interval=30s")
	for _, ns := range []string{"monitoring", "team", "ml-mon"} {
		if err := cluster.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	prom := func(ns, name, release string, nsSel *metav1.LabelSelector) *monitoringv1.Prometheus {
		sel := &metav1.LabelSelector{MatchLabels: map[string]string{"release": release}}
		p := &monitoringv1.Prometheus{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: monitoringv1.PrometheusSpec{
			CommonPrometheusFields: monitoringv1.CommonPrometheusFields{
				ServiceMonitorSelector: sel, ServiceMonitorNamespaceSelector: nsSel,
				PodMonitorSelector: sel, PodMonitorNamespaceSelector: nsSel,
			},
			RuleSelector: sel, RuleNamespaceSelector: nsSel,
		}}
		if err := cluster.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cluster.Client.Delete(ctx, p) })
		return p
	}
	prom("monitoring", "kps", "kps", &metav1.LabelSelector{})
	// Created later, so Loom learns kps's label; it reads every namespace
	// but selects release=team.
	time.Sleep(1100 * time.Millisecond)
	prom("team", "team", "team", &metav1.LabelSelector{})

	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "monitoring-stack"}}
	createPolicy(t, cp)
	msg := monitoringCondition(t, cp, monitoring.ConditionMonitoring, monitoring.ReasonSelected, func() []metav1.Condition { return cp.Status.Conditions })
	for _, want := range []string{"ServiceMonitor loom-system/loom-dcgm-exporter selected by Prometheus monitoring/kps",
		"labels release=kps learned from Prometheus monitoring/kps",
		"ServiceMonitor loom-system/loom-manager-metrics selected by Prometheus monitoring/kps",
		"not by Prometheus team/team: serviceMonitorSelector {release=team} needs label release=team"} {
		if !strings.Contains(msg, want) {
			t.Errorf("ClusterPolicy Monitoring message %q lacks %q", msg, want)
		}
	}

	job := simJob("ml-mon", "bert-mon", 1, nil, nil)
	for i := range job.Spec.ReplicaSpecs.Master.Template.Spec.Containers {
		job.Spec.ReplicaSpecs.Master.Template.Spec.Containers[i].Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}}
	}
	if err := cluster.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	monitoringCondition(t, job, monitoring.ConditionMonitoring, monitoring.ReasonSelected, func() []metav1.Condition { return job.Status.Conditions })
	rc := kuberaySample(t, "ray-cluster.sample.yaml", "ml-mon")
	if err := cluster.Client.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	monitoringCondition(t, rc, monitoring.RayConditionMonitoring, monitoring.ReasonSelected, func() []metav1.Condition { return rc.Status.Conditions })

	jobs := []string{
		"serviceMonitor/loom-system/loom-dcgm-exporter/0",
		"serviceMonitor/loom-system/loom-manager-metrics/0",
		"podMonitor/loom-system/loom-node-agent/0",
		"podMonitor/ml-mon/loom-trainingjob-bert-mon/0",
		"podMonitor/ml-mon/loom-raycluster-" + rc.Name + "/0",
	}
	started := time.Now()
	cfg, err := cluster.PrometheusConfig(ctx, "monitoring", "kps", 90*time.Second, func(cfg string) bool {
		for _, j := range jobs {
			if !strings.Contains(cfg, "job_name: "+j) {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("the operator's config for monitoring/kps lacks Loom's jobs %v: %v\n%s", jobs, err, cfg)
	}
	t.Logf("the Prometheus Operator selected Loom's monitors within %.1fs", time.Since(started).Seconds())
	for _, want := range []string{"__meta_kubernetes_pod_node_name", "honor_labels: true", "port_name", "gpu-metrics",
		"https-metrics", "scheme: https", "bearer_token_file: /var/run/secrets/kubernetes.io/serviceaccount/token"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("generated config lacks %q", want)
		}
	}
	files, err := cluster.PrometheusRuleFiles(ctx, "monitoring", "kps", 60*time.Second, func(files map[string]string) bool {
		for name, body := range files {
			if strings.Contains(name, "loom-gpu") && strings.Contains(body, "DCGM_FI_DEV_XID_ERRORS") {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("Loom's GPU rules are not in monitoring/kps's rule files: %v (files %v)", err, keys(files))
	}
	// The other Prometheus selects nothing of Loom's.
	other, err := cluster.PrometheusConfig(ctx, "team", "team", 60*time.Second, func(cfg string) bool {
		return strings.Contains(cfg, "scrape_configs") || strings.Contains(cfg, "global:")
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(other, "loom-dcgm-exporter") || strings.Contains(other, "loom-manager-metrics") || strings.Contains(other, "loom-trainingjob") {
		t.Errorf("Prometheus team/team selected Loom's monitors:\n%s", other)
	}

	// Deleting the workloads removes their PodMonitors (garbage collection).
	if err := cluster.Client.Delete(ctx, job); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.Delete(ctx, rc); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"loom-trainingjob-bert-mon", "loom-raycluster-" + rc.Name} {
		eventually(t, 60*time.Second, func() (bool, string) {
			err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: "ml-mon", Name: name}, &monitoringv1.PodMonitor{})
			return apierrors.IsNotFound(err), fmt.Sprintf("PodMonitor %s: %v", name, err)
		})
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
