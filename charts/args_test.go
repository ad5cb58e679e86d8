package charts

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// The command line the chart renders for the manager (and the uninstall
// hook's timeout), for any release name and values helm accepts, is one
// the manager takes: a refusal there is a
// crash loop after a helm install that succeeded. Values files hold every
// number as a float, which a template prints as 1e+06 from a million up;
// a release's name, and so its metrics Service's, may start with a digit.
func TestManagerTakesTheChartsArguments(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, []byte("manager:\n  maxWorkloadPods: 1000000\n  kubeAPIQPS: 2000000\n  kubeAPIBurst: 4000000\n"+
		"uninstall:\n  cleanup: true\n  timeoutSeconds: 1000000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		release string
		args    []string
		want    string
	}{
		{"loom", nil, "--max-workload-pods=5000"},
		{"1gpu", nil, "--metrics-service-monitor=1gpu-loom-metrics"},
		{strings.Repeat("r", 53), nil, "--metrics-service-monitor=" + strings.Repeat("r", 53) + "-l-metrics"},
		{"loom", []string{"-f", big}, "--max-workload-pods=1000000"},
		{"loom", []string{"--set", "manager.watchNamespaces={team-a,ml}", "--set", "monitoring.grafanaDashboards.namespace=monitoring",
			"--set", "manager.leaderElection.leaseName=loom.example.com"}, "--watch-namespaces=team-a,ml"},
		{"loom", []string{"--set", "monitoring.labels.example\\.com/team=ml", "--set", "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
			"--set", "manager.kueueLabelKeysToCopy={example.com/cost-center}"}, "--monitoring-labels=example.com/team=ml"},
		{"loom", []string{"--set-string", "manager.logLevel=10"}, "--log-level=10"},
	} {
		objs := renderRelease(t, tc.release, tc.args...)
		dep, ok := find[*appsv1.Deployment](objs, "")
		if !ok {
			t.Fatalf("%s %v: no Deployment", tc.release, tc.args)
		}
		args := dep.Spec.Template.Spec.Containers[0].Args
		if !strings.Contains(strings.Join(args, " "), tc.want) {
			t.Errorf("%s %v: args %q lack %s", tc.release, tc.args, args, tc.want)
		}
		opts := manager.DefaultOptions()
		fs := flag.NewFlagSet("loom manager", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		opts.BindFlags(fs)
		err := fs.Parse(args[1:])
		if err == nil {
			err = opts.Validate()
		}
		if err != nil || args[0] != "manager" {
			t.Errorf("%s %v: the manager refuses the chart's %q: %v", tc.release, tc.args, args, err)
		}
		if svc, ok := find[*corev1.Service](objs, ""); !ok || !slices.Contains(args, "--metrics-service-monitor="+svc.Name) {
			t.Errorf("%s %v: the manager is not told its metrics Service (%s): %q", tc.release, tc.args, svc.Name, args)
		}
		if job, ok := find[*batchv1.Job](objs, ""); ok {
			for _, a := range job.Spec.Template.Spec.Containers[0].Args {
				if v, ok := strings.CutPrefix(a, "--timeout="); ok {
					d, err := time.ParseDuration(v)
					if err != nil {
						t.Errorf("%s %v: the uninstall hook's %s: %v", tc.release, tc.args, a, err)
					}
					// The cleanup waits twice (operands and claimed nodes,
					// then the manager and the agents), each up to the
					// timeout: the Job must outlive both.
					if dl := job.Spec.ActiveDeadlineSeconds; dl == nil || time.Duration(*dl)*time.Second < 2*d+time.Minute {
						t.Errorf("%s %v: the uninstall hook's deadline %v s is shorter than its two waits of %s and a minute", tc.release, tc.args, dl, v)
					}
				}
			}
		}
	}
}

// Every object the chart renders is one the API server takes, for the
// longest release name helm allows (53 characters), the longest
// fullnameOverride (63) and a release name of one letter, with every
// optional object on: a Service's name and a Job's (its pods' job-name
// label) are at most 63 characters whatever the names they are built from.
func TestChartObjectsAreValidWhateverTheNames(t *testing.T) {
	ctx := context.Background()
	env, err := testenv.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	if err := env.CreateNamespace(ctx, "gpu-platform"); err != nil {
		t.Fatal(err)
	}
	all := []string{"--set", "uninstall.cleanup=true", "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
		"--api-versions", "monitoring.coreos.com/v1/PrometheusRule"}
	for _, tc := range []struct {
		release string
		args    []string
	}{
		{strings.Repeat("r", 53), nil},
		{"loom", []string{"--set", "fullnameOverride=" + strings.Repeat("f", 63)}},
		{"x", nil},
	} {
		args := append([]string{"template", tc.release, chartDir(), "--kube-version", "1.37.2", "--namespace", "gpu-platform",
			"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"}, append(all, tc.args...)...)
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		f := filepath.Join(t.TempDir(), "rendered.yaml")
		if err := os.WriteFile(f, []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
		objs, err := testenv.ReadManifests(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if err := env.Client.Create(ctx, o, client.DryRunAll); err != nil {
				t.Errorf("release %s %v: %s %s: %v", tc.release, tc.args, o.GetKind(), o.GetName(), err)
			}
		}
	}
}

// The image is pinned by image.digest (repository@digest, or
// repository:tag@digest) in every container the chart runs; a tag that is
// none (a digest given as the tag) or a digest that is none is refused at
// install, instead of pods that cannot pull (InvalidImageName).
func TestImageTagOrDigest(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0a", 32)
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{nil, "ghcr.io/loom-dev/loom:0.1.0"},
		{[]string{"image.digest=" + digest}, "ghcr.io/loom-dev/loom@" + digest},
		{[]string{"image.tag=v2", "image.digest=" + digest}, "ghcr.io/loom-dev/loom:v2@" + digest},
		{[]string{"image.tag=v2@" + digest}, "ghcr.io/loom-dev/loom:v2@" + digest},
	} {
		objs := render(t, append(tc.set, "uninstall.cleanup=true")...)
		dep, _ := find[*appsv1.Deployment](objs, "")
		ds, _ := find[*appsv1.DaemonSet](objs, "")
		job, _ := find[*batchv1.Job](objs, "")
		for _, c := range []corev1.Container{dep.Spec.Template.Spec.Containers[0], ds.Spec.Template.Spec.Containers[0], job.Spec.Template.Spec.Containers[0]} {
			if c.Image != tc.want {
				t.Errorf("%v: container %s image %s, want %s", tc.set, c.Name, c.Image, tc.want)
			}
		}
	}
	for _, set := range []string{"image.tag=" + digest, "image.tag=@" + digest, "image.tag=v2:latest", "image.digest=latest", "image.digest=sha256:abc"} {
		out, err := helm(t, "template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", set)
		if err == nil || !strings.Contains(out, "values don't meet the specifications of the schema") {
			t.Errorf("--set %s was accepted (err %v):\n%.300s", set, err, out)
		}
	}
}

// With the manager's monitoring controller left out of manager.controllers
// (training and Ray only), nothing in the manager writes its ServiceMonitor:
// auto has the chart render one where the CRD is installed, so that the
// manager is still scraped (and the chart's LoomManagerDown does not fire
// on a manager that runs).
func TestManagerServiceMonitorWithoutTheMonitoringController(t *testing.T) {
	const crd = "monitoring.coreos.com/v1/ServiceMonitor"
	for _, tc := range []struct {
		controllers string
		crd         bool
		chart       bool // the chart renders the ServiceMonitor
		flag        bool // the manager is told to write its own
	}{
		{"all", true, false, true},
		{"trainingjob\\,monitoring", true, false, true},
		{"trainingjob\\,raycluster", true, true, false},
		{"trainingjob\\,raycluster", false, false, false},
	} {
		args := []string{"template", "loom", chartDir(), "--kube-version", "1.37.2", "--set", "manager.controllers=" + tc.controllers}
		if tc.crd {
			args = append(args, "--api-versions", crd)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if chart := strings.Contains(out, "kind: ServiceMonitor"); chart != tc.chart {
			t.Errorf("controllers %s, CRD %v: the chart renders a ServiceMonitor: %v, want %v", tc.controllers, tc.crd, chart, tc.chart)
		}
		if flag := strings.Contains(out, "--metrics-service-monitor="); flag != tc.flag {
			t.Errorf("controllers %s, CRD %v: --metrics-service-monitor rendered: %v, want %v", tc.controllers, tc.crd, flag, tc.flag)
		}
	}
}

// Where the platform picks the UID (OpenShift's restricted SCC refuses a
// pod that names one outside the namespace's range), runAsUser and
// runAsGroup set to null leave them out of the manager's and the uninstall
// hook's pods, which keep the rest of the hardened defaults.
func TestManagerSecurityContextsAreValues(t *testing.T) {
	objs := render(t, "uninstall.cleanup=true", "manager.podSecurityContext.runAsUser=null", "manager.podSecurityContext.runAsGroup=null",
		"manager.securityContext.runAsUser=1000700000")
	dep, _ := find[*appsv1.Deployment](objs, "")
	job, _ := find[*batchv1.Job](objs, "")
	for _, pod := range []corev1.PodSpec{dep.Spec.Template.Spec, job.Spec.Template.Spec} {
		psc, sc := pod.SecurityContext, pod.Containers[0].SecurityContext
		if psc == nil || psc.RunAsUser != nil || psc.RunAsGroup != nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
			psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("pod %s securityContext %+v", pod.Containers[0].Name, psc)
		}
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 1000700000 || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != 1 {
			t.Errorf("container %s securityContext %+v", pod.Containers[0].Name, sc)
		}
	}
}
