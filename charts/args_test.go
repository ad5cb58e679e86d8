package charts

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"

	"github.com/loom-dev/loom/internal/manager"
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
		{"loom", []string{"-f", big}, "--max-workload-pods=1000000"},
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
		if job, ok := find[*batchv1.Job](objs, ""); ok {
			for _, a := range job.Spec.Template.Spec.Containers[0].Args {
				if v, ok := strings.CutPrefix(a, "--timeout="); ok {
					if _, err := time.ParseDuration(v); err != nil {
						t.Errorf("%s %v: the uninstall hook's %s: %v", tc.release, tc.args, a, err)
					}
				}
			}
		}
	}
}
