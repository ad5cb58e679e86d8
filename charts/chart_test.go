// Package charts tests the Helm chart in charts/loom: it must lint, render
// with the values schema enforced, and render objects that meet Loom's
// security baseline.
package charts

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/manager"
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
	var args []string
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return renderRelease(t, "loom", args...)
}

// renderRelease renders the chart as release in gpu-platform with helm
// template's extra args (--set, -f).
func renderRelease(t *testing.T, release string, extra ...string) []runtime.Object {
	t.Helper()
	args := []string{"template", release, chartDir(), "--kube-version", "1.37.2", "--namespace", "gpu-platform", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"}
	out, err := helm(t, append(args, extra...)...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme, policyv1.AddToScheme, batchv1.AddToScheme} {
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
		"manager.logLevel=007",
		"nodeAgent.logLevel=00",
		"nodeAgent.logFormat=logfmt",
		"nameOverride=Loom",
		"fullnameOverride=gpu_loom",
		"fullnameOverride=gpu-loom-",
		"manager.kubeAPIBurst=0",
		"image.pullPolicy=Sometimes",
		"manager.unknownKey=1",
		"bogusKey=1",
		"uninstall.bogus=true",
		"metrics.port=70000",
		"manager.controllers=training",
		"metrics.serviceMonitor.interval=0s",
		"metrics.serviceMonitor.interval=0m0s",
		"metrics.serviceMonitor.interval=10",
		"metrics.serviceMonitor.interval=1x",
		"nodeAgent.interval=0s",
		"nodeAgent.interval=",
		"nodeAgent.interval=5ms",
		"manager.watchNamespaces={team-a,Team_B}",
		"manager.watchNamespaces={*}",
		"manager.leaderElection.leaseName=Loom_Lease",
		"manager.leaderElection.leaseName=",
		"monitoring.grafanaDashboards.namespace=Monitoring",
		"monitoring.labels.release=kube prometheus",
		"monitoring.labels.bad key=x",
		"metrics.serviceMonitor.labels.release=" + strings.Repeat("x", 64),
		"metrics.prometheusRule.labels.-team=gpu",
		"manager.kueueLabelKeysToCopy={team,-cost}",
	} {
		out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", set)
		if err == nil || !strings.Contains(out, "values don't meet the specifications of the schema") {
			t.Errorf("--set %s was accepted (err %v):\n%.300s", set, err, out)
		}
	}
}

// TestSchemaAcceptsDurations: every duration Prometheus (and the agent's
// --interval) reads in that form passes, not only a single unit.
func TestSchemaAcceptsDurations(t *testing.T) {
	for _, set := range []string{
		"metrics.serviceMonitor.interval=1m30s",
		"metrics.serviceMonitor.interval=500ms",
		"metrics.serviceMonitor.interval=1h",
		"nodeAgent.interval=1m30s",
		"nodeAgent.interval=90s",
	} {
		out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2",
			"--set", "metrics.serviceMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor", "--set", set)
		if err != nil {
			t.Errorf("--set %s was refused: %v\n%.300s", set, err, out)
		} else if v := set[strings.Index(set, "=")+1:]; !strings.Contains(out, v) {
			t.Errorf("--set %s: %s not rendered", set, v)
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
	if clusterRoles != 5 || roles != 1 {
		t.Fatalf("rendered %d ClusterRoles and %d Roles, want 5 (manager, metrics reader, node agent, aggregated view and edit) and 1 (leases)", clusterRoles, roles)
	}
}

// The manager writes by server-side apply, patch, create and delete: it
// holds update only where a write needs it. Its leader election updates
// its Lease; the API server asks for update on an owner's finalizers
// before a child's owner reference may block the owner's deletion; RBAC
// lets it grant the operands update on nodes only if it holds that itself;
// and it may replace its own CRDs. Every other update would be a right no
// code path uses.
func TestManagerUpdatesOnlyWhereNeeded(t *testing.T) {
	allowed := func(resource string) bool {
		switch resource {
		case "leases", "nodes", "customresourcedefinitions":
			return true
		}
		return strings.HasSuffix(resource, "/finalizers")
	}
	var seen int
	for _, obj := range render(t) {
		var rules []rbacv1.PolicyRule
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			if o.Name == "loom-manager" {
				rules = o.Rules
			}
		case *rbacv1.Role:
			if o.Name == "loom-manager" {
				rules = o.Rules
			}
		}
		for _, r := range rules {
			seen++
			if !slices.Contains(r.Verbs, "update") {
				continue
			}
			for _, res := range r.Resources {
				if !allowed(res) {
					t.Errorf("the manager holds update on %s (%v), which it never updates", res, r.APIGroups)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no manager role rendered")
	}
}

// The node agent may read, create (server-side apply) and patch GPUNodes and
// nothing else; it lists and watches only its own, by name, to put back at
// once a GPUNode a person deletes or edits (reads it could already make
// with get).
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
		if strings.Join(r.APIGroups, ",") != "gpu.loom.dev" || (verbs != "get,patch" && verbs != "create,get,list,patch,watch") {
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
	// Privileged (NVML's device nodes without the nvidia runtime), yet a
	// read-only root, no capabilities kept, no host namespaces, and only
	// the three read-only host paths the agent reads.
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged || !*sc.ReadOnlyRootFilesystem ||
		len(sc.Capabilities.Drop) != 1 || pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Errorf("agent pod is not minimal: %+v %+v", c.SecurityContext, pod)
	}
	if pod.RuntimeClassName != nil {
		t.Errorf("runtimeClassName = %v: the agent must run before the nvidia runtime exists", *pod.RuntimeClassName)
	}
	checkAgentHostPaths(t, pod)
	args := strings.Join(c.Args, " ")
	if !strings.Contains(args, "--sysfs-root=/host-sys") || strings.Contains(args, "--driver-root") {
		t.Errorf("agent args %q", args)
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "NVIDIA_") {
			t.Errorf("agent env %s is for the nvidia runtime, which it does not use", e.Name)
		}
	}
	var nfd []string
	for _, term := range pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		nfd = append(nfd, term.MatchExpressions[0].Key)
	}
	if got := strings.Join(nfd, " "); got != "feature.node.kubernetes.io/pci-10de.present feature.node.kubernetes.io/pci-0302_10de.present "+
		"feature.node.kubernetes.io/pci-0300_10de.present nvidia.com/gpu.present" {
		t.Errorf("agent node affinity keys %s", got)
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

// checkAgentHostPaths: host /sys, /run/nvidia/driver and /, each mounted
// read-only; the driver root and / with HostToContainer propagation.
func checkAgentHostPaths(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	want := map[string]string{"/sys": "/host-sys", "/run/nvidia/driver": "/run/nvidia/driver", "/": "/host"}
	if len(pod.Volumes) != len(want) {
		t.Errorf("agent volumes %+v", pod.Volumes)
	}
	for _, v := range pod.Volumes {
		if v.HostPath == nil {
			t.Errorf("volume %s is not a host path", v.Name)
			continue
		}
		at, ok := want[v.HostPath.Path]
		found := false
		for _, m := range pod.Containers[0].VolumeMounts {
			if m.Name == v.Name {
				found = ok && m.MountPath == at && m.ReadOnly &&
					(at == "/host-sys" || m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationHostToContainer)
			}
		}
		if !found {
			t.Errorf("host path %s not mounted read-only where expected: %+v", v.HostPath.Path, pod.Containers[0].VolumeMounts)
		}
	}
}

// nodeAgent.privileged=false gives an unprivileged agent that cannot
// escalate.
func TestNodeAgentUnprivileged(t *testing.T) {
	out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", "nodeAgent.privileged=false",
		"--set", "nodeAgent.driverRoot=/opt/driver", "--show-only", "templates/node-agent.yaml")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.Contains(out, "privileged: true") || !strings.Contains(out, "allowPrivilegeEscalation: false") ||
		!strings.Contains(out, "--driver-root=/opt/driver") || !strings.Contains(out, "--log-format=json") {
		t.Errorf("unprivileged agent:\n%s", out)
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

// The manager's metrics, which Loom's GPU alerts are built on, are scraped
// by default: the manager is told its metrics Service and writes the
// ServiceMonitor itself once the Prometheus Operator is installed, so the
// chart renders none and needs no CRD. false turns it off; true renders
// the chart's own instead, which needs the CRD.
func TestManagerServiceMonitorByDefault(t *testing.T) {
	args := func(set ...string) string {
		dep, ok := find[*appsv1.Deployment](render(t, set...), "")
		if !ok {
			t.Fatal("no Deployment rendered")
		}
		return strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
	}
	if a := args(); !strings.Contains(a, "--metrics-service-monitor=loom-metrics --metrics-scrape-interval=30s") ||
		strings.Contains(a, "--metrics-service-monitor-labels") {
		t.Errorf("default args %s", a)
	}
	if a := args("metrics.serviceMonitor.labels.release=kube-prometheus-stack"); !strings.Contains(a, "--metrics-service-monitor-labels=release=kube-prometheus-stack") {
		t.Errorf("args %s", a)
	}
	for _, v := range []string{"false", "true"} {
		if a := args("metrics.serviceMonitor.enabled=" + v); strings.Contains(a, "--metrics-service-monitor") {
			t.Errorf("enabled=%s: args %s", v, a)
		}
	}
	for _, v := range []string{"auto", "false"} {
		out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", "metrics.serviceMonitor.enabled="+v)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if strings.Contains(out, "kind: ServiceMonitor") {
			t.Errorf("enabled=%s: the chart rendered a ServiceMonitor", v)
		}
	}
	out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", "metrics.serviceMonitor.enabled=true",
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
	if out, err := helm(t, "template", "loom", chartDir(), "--set", "metrics.serviceMonitor.enabled=yes"); err == nil {
		t.Errorf("enabled=yes accepted:\n%.300s", out)
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

// admissionPolicy renders the GPUNode writers' ValidatingAdmissionPolicy
// and its binding (nil, nil when the chart renders none).
func admissionPolicy(t *testing.T, set ...string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	t.Helper()
	args := []string{"template", "loom", chartDir(), "--kube-version", "1.37.2", "--namespace", "gpu-platform"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	scheme := runtime.NewScheme()
	if err := admissionregistrationv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	var vap *admissionregistrationv1.ValidatingAdmissionPolicy
	var binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, doc := range strings.Split(out, "\n---") {
		if !strings.Contains(doc, "kind: ValidatingAdmissionPolicy") || !strings.Contains(doc, "gpunode-writers") {
			continue
		}
		obj, _, err := decoder.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("decoding %v\n%s", err, doc)
		}
		switch o := obj.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			vap = o
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			binding = o
		}
	}
	return vap, binding
}

// The GPUNode writers' policy is on by default, names the release's own
// service accounts, exempts only the groups values name, and goes with
// admissionPolicies.enabled=false.
func TestGPUNodeAdmissionPolicyRenders(t *testing.T) {
	vap, binding := admissionPolicy(t)
	if vap == nil || binding == nil {
		t.Fatalf("policy %v, binding %v: not rendered by default", vap != nil, binding != nil)
	}
	if binding.Spec.PolicyName != vap.Name || len(binding.Spec.ValidationActions) != 1 || binding.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Errorf("binding %+v", binding.Spec)
	}
	if vap.Spec.FailurePolicy == nil || *vap.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", vap.Spec.FailurePolicy)
	}
	rules := vap.Spec.MatchConstraints.ResourceRules
	if len(rules) != 1 || strings.Join(rules[0].APIGroups, ",") != "gpu.loom.dev" || strings.Join(rules[0].Resources, ",") != "gpunodes,gpunodes/status" ||
		fmt.Sprint(rules[0].Operations) != "[CREATE UPDATE]" {
		t.Errorf("match %+v", rules)
	}
	vars := map[string]string{}
	for _, v := range vap.Spec.Variables {
		vars[v.Name] = v.Expression
	}
	for name, want := range map[string]string{
		"agent":     "'system:serviceaccount:gpu-platform:loom-node-agent'",
		"manager":   "'system:serviceaccount:gpu-platform:loom-manager'",
		"tokenNode": "authentication.kubernetes.io/node-name",
	} {
		if !strings.Contains(vars[name], want) {
			t.Errorf("variable %s = %q, want it to contain %s", name, vars[name], want)
		}
	}
	if len(vap.Spec.Validations) != 3 {
		t.Errorf("%d validations, want 3 (own node, inventory writes, finalizers and owner references)", len(vap.Spec.Validations))
	}
	if m := vap.Spec.MatchConditions; len(m) != 1 || m[0].Expression != "!request.userInfo.groups.exists(g, g in ['system:masters'])" {
		t.Errorf("match conditions %+v, want system:masters exempt", m)
	}
	if vap, _ := admissionPolicy(t, "admissionPolicies.exemptGroups=null"); vap == nil || len(vap.Spec.MatchConditions) != 0 {
		t.Errorf("exemptGroups=null: %+v", vap)
	}
	if vap, _ := admissionPolicy(t, "admissionPolicies.exemptGroups={a,b}"); vap == nil || vap.Spec.MatchConditions[0].Expression != "!request.userInfo.groups.exists(g, g in ['a', 'b'])" {
		t.Errorf("exemptGroups={a,b}: %+v", vap)
	}
	if vap, binding := admissionPolicy(t, "admissionPolicies.enabled=false"); vap != nil || binding != nil {
		t.Error("admissionPolicies.enabled=false still renders the policy")
	}
	for _, set := range []string{"admissionPolicies.enabled=yes", "admissionPolicies.exemptGroups={it's}", "admissionPolicies.other=1"} {
		out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", set)
		if err == nil || !strings.Contains(out, "values don't meet the specifications of the schema") {
			t.Errorf("--set %s was accepted (err %v)", set, err)
		}
	}
}

const admissionNS = "loom-system"

// TestGPUNodeAdmissionPolicyOnAPIServer loads the rendered policy into a
// real API server and writes GPUNodes as the node agents (impersonated, with
// the node name a pod-bound token carries), the manager, another user and
// an admin.
func TestGPUNodeAdmissionPolicyOnAPIServer(t *testing.T) {
	ctx := context.Background()
	env, err := testenv.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	objs, err := testenv.RenderChart(admissionNS)
	if err != nil {
		t.Fatal(err)
	}
	var keep []*unstructured.Unstructured
	for _, o := range objs {
		// The chart's GPUNode policy and the node agent's own one (which
		// also holds deletes): both judge every write below.
		if o.GetLabels()["app.kubernetes.io/component"] == "admission" || strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
			keep = append(keep, o)
		}
	}
	if len(keep) != 4 {
		t.Fatalf("chart rendered %d admission objects, want two policies and their bindings", len(keep))
	}
	if err := testenv.Apply(ctx, env.Config, env.Client, append(keep, gpuNodeWriterRBAC()...)); err != nil {
		t.Fatal(err)
	}
	agentA, agentB := impersonate(t, env.Config, agentUser, "node-a"), impersonate(t, env.Config, agentUser, "node-b")
	unbound, mgr, mallory := impersonate(t, env.Config, agentUser, ""), impersonate(t, env.Config, managerUser, ""), impersonate(t, env.Config, "mallory", "")

	// The policy takes a moment to become active.
	waitDenied(t, func() error { return mallory.Create(ctx, gpuNode("phantom")) },
		"only the Loom node agent on node phantom may write GPUNode phantom's inventory; mallory may not create it")

	// Each agent creates and publishes its own node's GPUNode.
	a, b := gpuNode("node-a"), gpuNode("node-b")
	must(t, agentA.Create(ctx, a))
	must(t, agentB.Create(ctx, b))
	a.Status.GPUCount, b.Status.GPUCount = 8, 8
	must(t, agentA.Status().Update(ctx, a))
	must(t, agentB.Status().Update(ctx, b))

	// Another node's agent, an agent whose token names no node, the
	// manager and anyone else may not create a GPUNode or write its status.
	for _, tt := range []struct {
		name  string
		write func() error
		want  string
	}{
		{"agent A publishes B", func() error { b := b.DeepCopy(); b.Status.GPUCount = 7; return agentA.Status().Update(ctx, b) },
			"the Loom node agent on node node-a may write only GPUNode node-a, not node-b"},
		{"agent A creates C", func() error { return agentA.Create(ctx, gpuNode("node-c")) },
			"the Loom node agent on node node-a may write only GPUNode node-a, not node-c"},
		{"agent without a node", func() error { a := a.DeepCopy(); a.Status.GPUCount = 1; return unbound.Status().Update(ctx, a) },
			"its token is not bound to a pod on a node"},
		{"manager publishes", func() error { a := a.DeepCopy(); a.Status.GPUCount = 1; return mgr.Status().Update(ctx, a) },
			"the Loom manager may change GPUNode metadata (owner references, labels), not write its status"},
		{"manager creates", func() error { return mgr.Create(ctx, gpuNode("node-d")) },
			"the Loom manager may change GPUNode metadata (owner references, labels), not create it"},
		{"someone publishes", func() error { a := a.DeepCopy(); a.Status.GPUCount = 1; return mallory.Status().Update(ctx, a) },
			"only the Loom node agent on node node-a may write GPUNode node-a's inventory; mallory may not write its status"},
	} {
		t.Run(tt.name, func(t *testing.T) { denied(t, tt.write(), tt.want) })
	}

	// The manager makes the Node the owner and labels the GPUNode.
	must(t, agentA.Get(ctx, client.ObjectKeyFromObject(a), a))
	a.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "node-a", UID: "node-a-uid"}}
	a.Labels = map[string]string{"example.com/by": "manager"}
	must(t, mgr.Update(ctx, a))

	// The agent may label its GPUNode, but not touch finalizers or owner
	// references, nor create one with them.
	must(t, agentA.Get(ctx, client.ObjectKeyFromObject(a), a))
	a.Labels["example.com/by"] = "agent"
	must(t, agentA.Update(ctx, a))
	const meddles = "the Loom node agent may not set or change a GPUNode's finalizers or owner references"
	finalizer, orphan := a.DeepCopy(), a.DeepCopy()
	finalizer.Finalizers = []string{"example.com/keep"}
	denied(t, agentA.Update(ctx, finalizer), meddles)
	orphan.OwnerReferences = nil
	denied(t, agentA.Update(ctx, orphan), meddles)
	owned := gpuNode("node-b")
	must(t, env.Client.Delete(ctx, b))
	owned.OwnerReferences = a.OwnerReferences
	denied(t, agentB.Create(ctx, owned), meddles)

	// An exempt admin (system:masters) may still write, as break-glass.
	admin := gpuNode("admin-made")
	must(t, env.Client.Create(ctx, admin))
	admin.Status.GPUCount = 1
	must(t, env.Client.Status().Update(ctx, admin))
}

const (
	agentUser   = "system:serviceaccount:" + admissionNS + ":loom-node-agent"
	managerUser = "system:serviceaccount:" + admissionNS + ":loom-manager"
)

// gpuNodeWriterRBAC lets the agent, the manager and mallory write GPUNodes
// and their status: what stops them is the policy, not RBAC.
func gpuNodeWriterRBAC() []*unstructured.Unstructured {
	role := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": "gpunode-writer"},
		"rules": []any{map[string]any{"apiGroups": []any{"gpu.loom.dev"}, "resources": []any{"gpunodes", "gpunodes/status"},
			"verbs": []any{"get", "list", "create", "update", "patch"}}}}}
	var subjects []any
	for _, u := range []string{agentUser, managerUser, "mallory"} {
		subjects = append(subjects, map[string]any{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": u})
	}
	binding := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": "gpunode-writer"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpunode-writer"},
		"subjects": subjects}}
	return []*unstructured.Unstructured{role, binding}
}

// impersonate is a client acting as user; node, when set, is the node name
// a token bound to a pod on that node carries.
func impersonate(t *testing.T, cfg *rest.Config, user, node string) client.Client {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
	}
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func gpuNode(name string) *gpuv1alpha1.GPUNode {
	return &gpuv1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func denied(t *testing.T, err error, want string) {
	t.Helper()
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want a denial mentioning %q", err, want)
	}
}

// waitDenied retries write until the policy denies it with want.
func waitDenied(t *testing.T, write func() error, want string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = write(); err != nil && strings.Contains(err.Error(), want) {
			return
		}
	}
	t.Fatalf("the policy never denied: %v (want %q)", err, want)
}

// manager.kueueManageJobsWithoutQueueName true becomes
// --kueue-manage-jobs-without-queue-name; off by default.
func TestKueueManageJobsWithoutQueueNameValue(t *testing.T) {
	args := func(set ...string) string {
		dep, ok := find[*appsv1.Deployment](render(t, set...), "")
		if !ok {
			t.Fatal("no Deployment rendered")
		}
		return strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
	}
	if a := args(); strings.Contains(a, "--kueue-manage-jobs-without-queue-name") {
		t.Errorf("rendered by default: %s", a)
	}
	if a := args("manager.kueueManageJobsWithoutQueueName=true"); !strings.Contains(a, "--kueue-manage-jobs-without-queue-name") {
		t.Errorf("args %s", a)
	}
}

// manager.kueueLabelKeysToCopy becomes --kueue-label-keys-to-copy; none by
// default.
func TestKueueLabelKeysToCopyValue(t *testing.T) {
	args := func(set ...string) string {
		dep, ok := find[*appsv1.Deployment](render(t, set...), "")
		if !ok {
			t.Fatal("no Deployment rendered")
		}
		return strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
	}
	if a := args(); strings.Contains(a, "--kueue-label-keys-to-copy") {
		t.Errorf("rendered by default: %s", a)
	}
	if a := args("manager.kueueLabelKeysToCopy={team,example.com/cost-center}"); !strings.Contains(a, "--kueue-label-keys-to-copy=team,example.com/cost-center") {
		t.Errorf("args %s", a)
	}
}
