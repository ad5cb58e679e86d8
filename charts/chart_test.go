// Package charts tests the Helm chart in charts/loom: it must lint, render
// with the values schema enforced, and render objects that meet Loom's
// security baseline.
package charts

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/loom-dev/loom/internal/testenv"
)

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	dir, err := testenv.ToolDir("helm")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(filepath.Join(dir, "helm"), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(cmd.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	err = cmd.Run()
	return out.String(), err
}

func chartDir() string { return "loom" }

func render(t *testing.T, set ...string) []runtime.Object {
	t.Helper()
	args := []string{"template", "loom", chartDir(), "--kube-version", "1.37.2", "--namespace", "gpu-platform", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	decoder := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	var objs []runtime.Object
	for _, doc := range strings.Split(out, "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" || !strings.Contains(doc, "kind:") {
			continue
		}
		obj, gvk, err := decoder.Decode([]byte(doc), nil, nil)
		if err != nil {
			if runtime.IsNotRegisteredError(err) {
				continue // e.g. the ServiceMonitor
			}
			t.Fatalf("decoding rendered %v: %v\n%s", gvk, err, doc)
		}
		objs = append(objs, obj)
	}
	return objs
}

func TestChartLints(t *testing.T) {
	if out, err := helm(t, "lint", chartDir(), "--strict"); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}

func TestSchemaRejectsBadValues(t *testing.T) {
	for _, set := range []string{
		"manager.replicas=-1",
		"manager.logLevel=loud",
		"manager.kubeAPIBurst=0",
		"image.pullPolicy=Sometimes",
		"manager.unknownKey=1",
		"metrics.port=70000",
	} {
		out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", set)
		if err == nil || !strings.Contains(out, "values don't meet the specifications of the schema") {
			t.Errorf("--set %s was accepted (err %v):\n%.300s", set, err, out)
		}
	}
}

func TestRenderedRBACHasNoWildcards(t *testing.T) {
	var clusterRoles, roles int
	for _, obj := range render(t) {
		var rules []rbacv1.PolicyRule
		var name string
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			clusterRoles++
			rules, name = o.Rules, "ClusterRole "+o.Name
		case *rbacv1.Role:
			roles++
			rules, name = o.Rules, "Role "+o.Namespace+"/"+o.Name
			if o.Namespace != "gpu-platform" {
				t.Errorf("%s is not in the release namespace", name)
			}
		default:
			continue
		}
		if len(rules) == 0 {
			t.Errorf("%s has no rules", name)
		}
		for _, r := range rules {
			for _, field := range [][]string{r.Verbs, r.Resources, r.APIGroups, r.NonResourceURLs} {
				for _, v := range field {
					if strings.Contains(v, "*") {
						t.Errorf("%s has a wildcard %q in %+v", name, v, r)
					}
				}
			}
		}
	}
	if clusterRoles != 3 || roles != 1 {
		t.Fatalf("rendered %d ClusterRoles and %d Roles, want 3 (manager, metrics reader, node agent) and 1 (leases)", clusterRoles, roles)
	}
}

// The node agent may read, create (server-side apply) and patch GPUNodes and
// nothing else.
func TestNodeAgentIsLeastPrivileged(t *testing.T) {
	var ds *appsv1.DaemonSet
	var role *rbacv1.ClusterRole
	for _, obj := range render(t) {
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *rbacv1.ClusterRole:
			if o.Name == "loom-node-agent" {
				role = o
			}
		}
	}
	if role == nil || ds == nil {
		t.Fatalf("node agent ClusterRole %v or DaemonSet %v not rendered", role != nil, ds != nil)
	}
	for _, r := range role.Rules {
		verbs := strings.Join(r.Verbs, ",")
		if strings.Join(r.APIGroups, ",") != "gpu.loom.dev" || (verbs != "get,patch" && verbs != "create,get,patch") {
			t.Errorf("agent rule %+v", r)
		}
		for _, res := range r.Resources {
			if res != "gpunodes" && res != "gpunodes/status" {
				t.Errorf("agent may touch %s", res)
			}
		}
	}
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged != nil || !*c.SecurityContext.ReadOnlyRootFilesystem ||
		len(c.SecurityContext.Capabilities.Drop) != 1 || pod.HostNetwork || pod.HostPID || len(pod.Volumes) != 0 {
		t.Errorf("agent pod is not minimal: %+v %+v", c.SecurityContext, pod)
	}
	if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" {
		t.Errorf("runtimeClassName = %v", pod.RuntimeClassName)
	}
	tolerates := false
	for _, tol := range pod.Tolerations {
		tolerates = tolerates || (tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists)
	}
	if !tolerates || pod.Affinity == nil || pod.Affinity.NodeAffinity == nil {
		t.Errorf("agent does not target GPU nodes: tolerations %+v affinity %+v", pod.Tolerations, pod.Affinity)
	}
	if env := c.Env[0]; env.Name != "NODE_NAME" || env.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME env = %+v", env)
	}
}

func TestManagerDeploymentIsHardened(t *testing.T) {
	var dep *appsv1.Deployment
	for _, obj := range render(t) {
		if d, ok := obj.(*appsv1.Deployment); ok {
			dep = d
		}
	}
	if dep == nil {
		t.Fatal("no Deployment rendered")
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", dep.Spec.Replicas)
	}
	for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "app.kubernetes.io/component"} {
		if dep.Labels[k] == "" || dep.Spec.Template.Labels[k] == "" {
			t.Errorf("label %s missing on the Deployment or its pods", k)
		}
	}
	pod := dep.Spec.Template.Spec
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want runAsNonRoot and RuntimeDefault seccomp", psc)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 {
		t.Errorf("container securityContext = %+v", sc)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes: liveness %+v readiness %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v", c.Resources)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"manager", "--leader-elect=true", "--leader-election-id=loom-manager", "--controllers=all", "--kube-api-qps=300"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
}

func TestServiceMonitorIsOptional(t *testing.T) {
	out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "kind: ServiceMonitor") {
		t.Error("ServiceMonitor rendered although disabled")
	}
	out, err = helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.serviceMonitor.labels.release=kube-prometheus-stack", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "kind: ServiceMonitor") || !strings.Contains(out, "release: kube-prometheus-stack") {
		t.Errorf("ServiceMonitor with labels not rendered:\n%s", out)
	}
	out, err = helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", "metrics.serviceMonitor.enabled=true")
	if err == nil || !strings.Contains(out, "needs the Prometheus Operator's ServiceMonitor CRD") {
		t.Errorf("enabling the ServiceMonitor without its CRD did not fail clearly: %v\n%.300s", err, out)
	}
}

// The manager's alert rules are off by default, need the CRD, and carry the
// monitoring labels; monitoring.labels reach the manager as
// --monitoring-labels.
func TestManagerAlertRulesAndMonitoringLabels(t *testing.T) {
	out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "kind: PrometheusRule") || strings.Contains(out, "--monitoring-labels") {
		t.Error("PrometheusRule or --monitoring-labels rendered by default")
	}
	if !strings.Contains(out, "--grafana-dashboards=true") {
		t.Error("dashboards not on by default")
	}
	if !strings.Contains(out, "name: GOMEMLIMIT") || !strings.Contains(out, "resource: limits.memory") {
		t.Error("the manager's GOMEMLIMIT does not follow its memory limit")
	}
	out, err = helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", "metrics.prometheusRule.enabled=true",
		"--set", "monitoring.labels.release=kps", "--set", "monitoring.labels.team=gpu", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"kind: PrometheusRule", "release: kps", "alert: LoomManagerReconcileErrors", "alert: LoomManagerDown",
		"controller_runtime_reconcile_errors_total", "- --monitoring-labels=release=kps,team=gpu", "$labels.controller"} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered chart lacks %q", want)
		}
	}
	out, err = helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", "metrics.prometheusRule.enabled=true")
	if err == nil || !strings.Contains(out, "needs the Prometheus Operator's PrometheusRule CRD") {
		t.Errorf("enabling the rules without their CRD did not fail clearly: %v\n%.300s", err, out)
	}
}
