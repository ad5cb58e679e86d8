package monitoring

import (
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	monitoringv1alpha1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/optional"
	"github.com/loom-dev/loom/internal/testenv"
)

// A restart (or a leader change) over converged monitoring writes nothing:
// fresh GPU and workload reconcilers, with fresh writers reading the
// manager's cache, find the exporter's Service, the ConfigMaps, the
// ServiceMonitor, the PodMonitors (the node agent's, a TrainingJob's and a
// RayCluster's), the PrometheusRule and each Monitoring condition as they
// were applied, whatever the API server defaulted, and leave them.
func TestRestartWritesNothing(t *testing.T) {
	withOperatorCRDs(t)
	m := startManager(t)
	createProm(t, "monitoring", "kps", kpsSpec("kps"))
	cp := createPolicy(t, gpuv1alpha1.ClusterPolicySpec{})
	if err := env.CreateNamespace(ctx(), "restart"); err != nil {
		t.Fatal(err)
	}
	job := trainingJob("restart", "bert", true)
	if err := env.Client.Create(ctx(), job); err != nil {
		t.Fatal(err)
	}
	rc, err := testenv.KubeRaySample("ray-cluster.sample.yaml", "restart")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx(), rc); err != nil {
		t.Fatal(err)
	}
	policyCondition(t, cp, ReasonSelected)
	condition(t, job, ConditionMonitoring, ReasonSelected, func() []metav1.Condition { return job.Status.Conditions })
	condition(t, rc, RayConditionMonitoring, ReasonSelected, func() []metav1.Condition { return rc.Status.Conditions })
	for _, o := range []client.Object{
		&monitoringv1.ServiceMonitor{ObjectMeta: key(loomNS, ExporterName)},
		&monitoringv1.PrometheusRule{ObjectMeta: key(loomNS, RuleName)},
		&monitoringv1.PodMonitor{ObjectMeta: key(loomNS, NodeAgentPodMonitorName)},
		&monitoringv1.PodMonitor{ObjectMeta: key("restart", TrainingJobPodMonitorName(job.Name))},
		&monitoringv1.PodMonitor{ObjectMeta: key("restart", RayClusterPodMonitorName(rc.Name))},
	} {
		exists(t, o)
	}
	time.Sleep(2 * time.Second) // the running manager's passes are over

	counter := testenv.CountWrites(m.GetClient())
	opts := testenv.ManagerOptions(t)
	crds := func() operatorCRDs {
		return operatorCRDs{
			crdKind("servicemonitors", monitoringv1.SchemeGroupVersion.WithKind(monitoringv1.ServiceMonitorsKind), nil),
			crdKind("prometheusrules", monitoringv1.SchemeGroupVersion.WithKind(monitoringv1.PrometheusRuleKind), nil),
			crdKind("podmonitors", monitoringv1.SchemeGroupVersion.WithKind(monitoringv1.PodMonitorsKind), nil),
			crdKind("prometheuses", monitoringv1.SchemeGroupVersion.WithKind(monitoringv1.PrometheusesKind), nil),
			crdKind("prometheusagents", monitoringv1alpha1.SchemeGroupVersion.WithKind(monitoringv1alpha1.PrometheusAgentsKind), nil),
		}
	}
	gr := newGPUReconciler(counter, m.GetAPIReader(), m.GetCache(), opts)
	gr.crds = crds()
	if _, err := gr.Reconcile(ctx(), ctrl.Request{NamespacedName: client.ObjectKey{Name: "gpu"}}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		kind workloadKind
		obj  client.Object
	}{{trainingJobs, job}, {rayClusters, rc}} {
		r := newWorkloadReconciler(counter, m.GetCache(), opts, w.kind)
		r.crds = crds()
		if w.kind.crd != "" {
			r.workload = &optional.Kind{CRD: w.kind.crd, GVK: w.kind.gvk}
		}
		if _, err := r.Reconcile(ctx(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(w.obj)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := counter.Writes(); len(got) != 0 {
		t.Fatalf("restarted monitoring reconcilers wrote over converged children: %v", got)
	}
}
