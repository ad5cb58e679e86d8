package charts

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/internal/cli"
	"github.com/loom-dev/loom/internal/manager"
)

// The values the chart copies into a pod's fields (resources, tolerations,
// nodeSelector, affinity, priorityClassName, the security contexts, the
// environment, annotations and labels) are checked by the schema at helm
// install, with a message naming the value: a typo in a key (limit for
// limits) would otherwise do nothing, and a value that is no quantity or
// no effect would be refused object by object by the API server.
func TestSchemaRefusesBadPodFields(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"manager.resources.limit.memory=1Gi", "at '/manager/resources': additional properties 'limit' not allowed"},
		{"manager.resources.limits.memroy=1Gi", "at '/manager/resources/limits': additional properties 'memroy' not allowed"},
		{"manager.resources.limits.memory=lots", "at '/manager/resources/limits/memory'"},
		{"manager.resources.requests.cpu=1Gb", "at '/manager/resources/requests/cpu'"},
		{"manager.resources.requests.cpu=-1", "at '/manager/resources/requests/cpu'"},
		{"manager.resources.requests.gpu=1", "at '/manager/resources/requests': additional properties 'gpu' not allowed"},
		{"nodeAgent.resources.limits.memory=128MB", "at '/nodeAgent/resources/limits/memory'"},
		{"nodeAgent.resources.request.cpu=10m", "at '/nodeAgent/resources': additional properties 'request' not allowed"},
		{"manager.resources.claims[0].name=gpu", "at '/manager/resources': additional properties 'claims' not allowed"},
		{"manager.tolerations[0].effect=NoScheduled", "at '/manager/tolerations/0/effect'"},
		{"manager.tolerations[0].operator=Exist", "at '/manager/tolerations/0/operator'"},
		{"nodeAgent.tolerations[0].keys=gpu", "at '/nodeAgent/tolerations/0': additional properties 'keys' not allowed"},
		{"nodeAgent.tolerations[0].tolerationSeconds=soon", "at '/nodeAgent/tolerations/0/tolerationSeconds'"},
		{"manager.tolerations[0].operator=Exists,manager.tolerations[0].value=gpu", "at '/manager/tolerations/0/value'"},
		{"manager.tolerations[0].effect=NoSchedule", "at '/manager/tolerations/0"},
		{"manager.tolerations[0].key=gpu,manager.tolerations[0].effect=NoSchedule,manager.tolerations[0].tolerationSeconds=60", "at '/manager/tolerations/0/effect'"},
		{"manager.nodeSelector.kubernetes\\.io/os=linux os", "at '/manager/nodeSelector/kubernetes.io~1os'"},
		{"nodeAgent.nodeSelector.bad key=x", "at '/nodeAgent/nodeSelector': additional properties 'bad key' not allowed"},
		{"manager.affinity.nodeAfinity.x=1", "at '/manager/affinity': additional properties 'nodeAfinity' not allowed"},
		{"manager.priorityClassName=High_Priority", "at '/manager/priorityClassName'"},
		{"nodeAgent.priorityClassName=System Node Critical", "at '/nodeAgent/priorityClassName'"},
		{"manager.podSecurityContext.runAsUser=-1", "at '/manager/podSecurityContext/runAsUser'"},
		{"manager.podSecurityContext.runAsNonroot=true", "at '/manager/podSecurityContext': additional properties 'runAsNonroot' not allowed"},
		{"manager.podSecurityContext.seccompProfile.type=Default", "at '/manager/podSecurityContext/seccompProfile/type'"},
		{"manager.securityContext.readOnlyRootFileSystem=true", "at '/manager/securityContext': additional properties 'readOnlyRootFileSystem' not allowed"},
		{"manager.securityContext.capabilities.drops={ALL}", "at '/manager/securityContext/capabilities': additional properties 'drops' not allowed"},
		{"manager.extraEnv[0].value=1", "at '/manager/extraEnv/0'"},
		{"manager.extraEnv[0].name=GOGC,manager.extraEnv[0].values=50", "at '/manager/extraEnv/0': additional properties 'values' not allowed"},
		{"imagePullSecrets[0].nme=regcred", "at '/imagePullSecrets/0'"},
		{"manager.podAnnotations.bad key=x", "at '/manager/podAnnotations': additional properties 'bad key' not allowed"},
		{"serviceAccount.annotations.a/b/c=x", "at '/serviceAccount/annotations': additional properties 'a/b/c' not allowed"},
		{"manager.podLabels.team=ml team", "at '/manager/podLabels/team'"},
		// A tag or digest in the repository would render repository:tag:appVersion.
		{"image.repository=ghcr.io/loom-dev/loom:v1", "at '/image/repository'"},
		{"image.repository=ghcr.io/loom-dev/loom@sha256:" + strings.Repeat("0", 64), "at '/image/repository'"},
	} {
		out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", tc.set)
		if err == nil || !strings.Contains(out, "values don't meet the specifications of the schema") || !strings.Contains(out, tc.want) {
			t.Errorf("--set %s: err %v, want a schema error %s:\n%.400s", tc.set, err, tc.want, out)
		}
	}
}

// Every form the API server takes passes the schema and reaches the pod:
// quantities as strings or numbers (a values file holds 1e9 as a float,
// which helm prints 1e+09), extended resources, every toleration field,
// affinity, and the rest of the security context fields.
func TestSchemaAcceptsPodFields(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`
imagePullSecrets: [{name: regcred}]
manager:
  resources:
    requests: {cpu: 0.5, memory: 1000000000, ephemeral-storage: 1Gi}
    limits: {cpu: 2, memory: 1.5Gi, hugepages-2Mi: 64Mi, example.com/widget: 1}
  tolerations:
    - {key: dedicated, operator: Equal, value: gpu, effect: NoExecute, tolerationSeconds: 300}
    - {operator: Exists}
  nodeSelector: {kubernetes.io/os: linux, node-role.kubernetes.io/control-plane: ""}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [system]}]}]
  priorityClassName: system-cluster-critical
  podSecurityContext: {fsGroup: 65532, supplementalGroups: [1000], fsGroupChangePolicy: OnRootMismatch}
  securityContext: {runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}
  extraEnv:
    - {name: GOGC, value: "50"}
    - name: NODE
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
  podAnnotations: {example.com/owner: "team ml"}
nodeAgent:
  resources:
    requests: {cpu: 10m, memory: 32Mi}
    limits: {memory: "256Mi", nvidia.com/gpu: "0"}
  tolerations: [{key: example.com/gpu-pool, operator: Exists, effect: NoSchedule}]
  nodeSelector: {pool: gpu}
  priorityClassName: ""
serviceAccount:
  annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::1:role/loom"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := renderRelease(t, "loom", "-f", values, "--set", "image.repository=registry.example.com:5000/mirror/loom")
	dep, _ := find[*appsv1.Deployment](objs, "loom-manager")
	ds, _ := find[*appsv1.DaemonSet](objs, "loom-node-agent")
	if dep == nil || ds == nil {
		t.Fatal("no manager Deployment or node agent DaemonSet")
	}
	pod, c := dep.Spec.Template.Spec, dep.Spec.Template.Spec.Containers[0]
	if got := c.Resources.Requests.Memory().Value(); got != 1000000000 {
		t.Errorf("manager requests.memory %d, want 1e9", got)
	}
	if got := c.Resources.Requests.Cpu().MilliValue(); got != 500 {
		t.Errorf("manager requests.cpu %dm, want 500m", got)
	}
	if got := c.Resources.Limits[corev1.ResourceName("example.com/widget")]; got.Value() != 1 {
		t.Errorf("manager limits: %v", c.Resources.Limits)
	}
	if len(pod.Tolerations) != 2 || pod.Tolerations[0].TolerationSeconds == nil || *pod.Tolerations[0].TolerationSeconds != 300 {
		t.Errorf("manager tolerations %+v", pod.Tolerations)
	}
	if pod.Affinity == nil || pod.Affinity.NodeAffinity == nil || pod.PriorityClassName != "system-cluster-critical" ||
		pod.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("manager scheduling: affinity %+v, priority %q, nodeSelector %v", pod.Affinity, pod.PriorityClassName, pod.NodeSelector)
	}
	if psc := pod.SecurityContext; psc == nil || psc.FSGroup == nil || *psc.FSGroup != 65532 || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("manager pod securityContext %+v", psc)
	}
	if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 1000 || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("manager securityContext %+v", sc)
	}
	if c.Image != "registry.example.com:5000/mirror/loom:0.1.0" {
		t.Errorf("manager image %s", c.Image)
	}
	agent := ds.Spec.Template.Spec
	if got := agent.Containers[0].Resources.Limits.Memory().String(); got != "256Mi" {
		t.Errorf("node agent limits.memory %s, want 256Mi", got)
	}
	if agent.NodeSelector["pool"] != "gpu" || agent.PriorityClassName != "" || len(agent.Tolerations) != 3 {
		t.Errorf("node agent scheduling: nodeSelector %v, priority %q, tolerations %+v", agent.NodeSelector, agent.PriorityClassName, agent.Tolerations)
	}
}

// helm upgrade --reuse-values renders the new chart with the old release's
// values in place of the new chart's values.yaml: a value the new chart
// added is missing, not defaulted. Each template falls back to the chart's
// default for every value left out (within resources and the security
// contexts, only for the whole block: a key of theirs set to null stays
// out), so such an upgrade renders what a fresh install would: the same
// security contexts, flags and objects.
func TestReuseValuesFromAnOlderRelease(t *testing.T) {
	var defaults map[string]any
	raw, err := os.ReadFile(filepath.Join(chartDir(), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &defaults); err != nil {
		t.Fatal(err)
	}
	older := withoutKeys(defaults, "manager.podSecurityContext", "manager.securityContext", "nodeAgent.logFormat",
		"criticalPodsQuota", "image.digest", "manager.kueueLabelKeysToCopy", "uninstall.timeoutSeconds", "monitoring.grafanaDashboards.namespace")
	args := []string{"--kube-version", "1.37.2", "--namespace", "gpu-platform",
		"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
		"--set", "uninstall.cleanup=true", "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true"}
	want, err := helm(t, append([]string{"template", "loom", chartDir()}, args...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, want)
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		set    []string
	}{
		{"an older chart's values", older, nil},
		// The schema requires image.repository: helm sets it, from the
		// older release's values, in any upgrade.
		{"sections without their values", withImage(sectionsOnly(defaults)), nil},
		{"no values", map[string]any{}, nil},
		// A value set to null (which helm removes) takes its default.
		{"values set to null", defaults, []string{"nodeAgent.logFormat=null", "uninstall.timeoutSeconds=null", "manager.resources=null", "monitoring.grafanaDashboards=null"}},
	} {
		extra := args
		for _, s := range tc.set {
			extra = append(extra, "--set", s)
		}
		got, err := helm(t, append([]string{"template", "loom", chartWithValues(t, tc.values)}, extra...)...)
		if err != nil {
			t.Errorf("%s: %v\n%.600s", tc.name, err, got)
			continue
		}
		if got != want {
			t.Errorf("%s: rendered\n%s\nwhere a fresh install renders\n%s", tc.name, diff(want, got), diff(got, want))
		}
	}
}

// withoutKeys is values without the dotted paths.
func withoutKeys(values map[string]any, paths ...string) map[string]any {
	out := deepCopy(values)
	for _, p := range paths {
		m, keys := out, strings.Split(p, ".")
		for _, k := range keys[:len(keys)-1] {
			m = m[k].(map[string]any)
		}
		delete(m, keys[len(keys)-1])
	}
	return out
}

// sectionsOnly keeps values' maps and lists (a list left out is one set to
// null: none) and drops every other value, and the blocks (resources,
// security contexts) as a whole.
func sectionsOnly(values map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range values {
		switch v := v.(type) {
		case []any:
			out[k] = v
		case map[string]any:
			if len(v) > 0 && !strings.HasSuffix(k, "ecurityContext") && k != "resources" {
				out[k] = sectionsOnly(v)
			}
		}
	}
	return out
}

func withImage(values map[string]any) map[string]any {
	values["image"] = map[string]any{"repository": "ghcr.io/loom-dev/loom"}
	return values
}

func deepCopy(values map[string]any) map[string]any {
	out := make(map[string]any, len(values))
	for k, v := range values {
		if m, ok := v.(map[string]any); ok {
			v = deepCopy(m)
		}
		out[k] = v
	}
	return out
}

// chartWithValues is a copy of the chart whose values.yaml is values.
func chartWithValues(t *testing.T, values map[string]any) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "loom")
	if err := os.CopyFS(dir, os.DirFS(chartDir())); err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(values)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "values.yaml"), b, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// diff is the lines of a not in b.
func diff(a, b string) string {
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if !strings.Contains(b, l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The defaults the templates fall back to are values.yaml's.
func TestDefaultsCopyIsCurrent(t *testing.T) {
	values, err := os.ReadFile(filepath.Join(chartDir(), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile(filepath.Join(chartDir(), "files", "values.yaml"))
	if err != nil || string(copied) != string(values) {
		t.Errorf("charts/loom/files/values.yaml is not values.yaml (%v): run make manifests", err)
	}
}

// Labels and annotations of the user's that the chart sets too (a pod
// label app.kubernetes.io/part-of, the default-container annotation, a
// monitoring label app.kubernetes.io/component) are set once, the user's
// value, instead of the key twice in the rendered YAML, which strict
// decoders refuse and others read as either value.
func TestUserLabelsOverTheChartsAreNotDuplicated(t *testing.T) {
	out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--namespace", "gpu-platform",
		"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
		"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
		"--set", "manager.podLabels.app\\.kubernetes\\.io/part-of=gpu-platform",
		"--set", "manager.podAnnotations.kubectl\\.kubernetes\\.io/default-container=sidecar",
		"--set", "monitoring.labels.app\\.kubernetes\\.io/component=metrics",
		"--set", "metrics.serviceMonitor.labels.app\\.kubernetes\\.io/part-of=monitoring")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	seen := 0
	for _, doc := range strings.Split(out, "\n---") {
		var obj struct {
			Kind     string
			Metadata struct{ Labels map[string]string }
			Spec     struct {
				Template struct {
					Metadata struct{ Labels, Annotations map[string]string }
				}
			}
		}
		var strict map[string]any
		if err := yaml.UnmarshalStrict([]byte(doc), &strict); err != nil {
			t.Errorf("%v in\n%s", err, doc)
			continue
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		switch obj.Kind {
		case "Deployment":
			seen++
			if m := obj.Spec.Template.Metadata; m.Labels["app.kubernetes.io/part-of"] != "gpu-platform" || m.Annotations["kubectl.kubernetes.io/default-container"] != "sidecar" {
				t.Errorf("the manager's pod labels %v, annotations %v", m.Labels, m.Annotations)
			}
		case "ServiceMonitor", "PrometheusRule":
			seen++
			if l := obj.Metadata.Labels; l["app.kubernetes.io/component"] != "metrics" || (obj.Kind == "ServiceMonitor") != (l["app.kubernetes.io/part-of"] == "monitoring") {
				t.Errorf("%s labels %v", obj.Kind, l)
			}
		}
	}
	if seen != 3 {
		t.Errorf("%d of the Deployment, ServiceMonitor and PrometheusRule rendered", seen)
	}
}

// manager.extraArgs are checked against loom manager's flags at install:
// a flag it does not have, a value that follows no flag (a boolean's
// "--enable-http2 false") or a flag left without its value would
// crash-loop the manager after helm install succeeded, and a flag the chart
// sets would override the value the chart's objects follow. Every other
// flag the manager has passes, in each form Go's flag package takes; the
// chart's two lists of them are the manager's.
func TestManagerExtraArgsAreItsFlags(t *testing.T) {
	fs := flag.NewFlagSet("loom manager", flag.ContinueOnError)
	opts := manager.DefaultOptions()
	opts.BindFlags(fs)
	var common cli.Common
	common.Bind(fs)
	var valued, bools []string
	fs.VisitAll(func(f *flag.Flag) {
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			if f.Name != "version" { // prints the version and exits
				bools = append(bools, f.Name)
			}
		} else {
			valued = append(valued, f.Name)
		}
	})
	helpers, err := os.ReadFile(filepath.Join(chartDir(), "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]string{"loom.managerFlags": valued, "loom.managerBoolFlags": bools} {
		m := regexp.MustCompile(`define "` + regexp.QuoteMeta(name) + `" -}}\n(.*)\n`).FindSubmatch(helpers)
		if m == nil || !slices.Equal(strings.Fields(string(m[1])), want) {
			t.Errorf("_helpers.tpl's %s is not the manager's: want\n%s", name, strings.Join(want, " "))
		}
	}
	// The flags the chart sets, each from a value (or a namespace and port
	// its objects follow), are refused, naming what to set instead.
	dep, _ := find[*appsv1.Deployment](render(t, "manager.watchNamespaces={a}", "manager.kueueLabelKeysToCopy={team}",
		"manager.kueueManageJobsWithoutQueueName=true", "monitoring.labels.a=b", "monitoring.grafanaDashboards.namespace=mon",
		"metrics.serviceMonitor.labels.a=b"), "loom-manager")
	chart := []string{"namespace", "leader-election-namespace"}
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args[1:] {
		chart = append(chart, strings.TrimPrefix(strings.SplitN(a, "=", 2)[0], "--"))
	}
	for _, f := range chart {
		out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set-string", "manager.extraArgs={--"+f+"=x}")
		if err == nil || !strings.Contains(out, "manager.extraArgs: --"+f+" is the chart's: ") {
			t.Errorf("extraArgs --%s=x, which the chart sets: err %v\n%.300s", f, err, out)
		}
	}
	var every []string
	for _, f := range valued {
		if !slices.Contains(chart, f) {
			every = append(every, "--"+f+"=x", "-"+f, "x")
		}
	}
	for _, f := range bools {
		if !slices.Contains(chart, f) {
			every = append(every, "--"+f, "-"+f+"=false")
		}
	}
	values := filepath.Join(t.TempDir(), "values.yaml")
	b, err := yaml.Marshal(map[string]any{"manager": map[string]any{"extraArgs": every}})
	if err == nil {
		err = os.WriteFile(values, b, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	if out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "-f", values); err != nil {
		t.Errorf("every flag of the manager's: %v\n%.600s", err, out)
	}
	for _, tc := range []struct{ set, want string }{
		{"manager.extraArgs={--leader-election-lease-durations=90s}", `"--leader-election-lease-durations=90s" is not a flag of loom manager`},
		{"manager.extraArgs={--enable-http2,false}", `"false" is not a flag of loom manager`},
		{"manager.extraArgs={leader-elect=false}", `"leader-elect=false" is not a flag of loom manager`},
		{"manager.extraArgs={--version}", `"--version" is not a flag of loom manager`},
		{"manager.extraArgs={--,--enable-http2=false}", `"--" is not a flag of loom manager`},
		{"manager.extraArgs={--pprof-bind-address}", `manager.extraArgs ends with --pprof-bind-address, which takes a value`},
	} {
		out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set-string", tc.set)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("--set-string %s: err %v, want a failure saying %s:\n%.300s", tc.set, err, tc.want, out)
		}
	}
}
