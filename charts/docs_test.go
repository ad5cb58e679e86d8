package charts

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The docs name the chart's objects as <fullname>-<suffix> (the release
// name when it holds the chart's name, else <release>-loom, or
// fullnameOverride), never <release>-<suffix>, which a release named
// anything but loom-something does not have: every such name is one the
// chart renders for a release named gpu (full name gpu-loom) with every
// optional object on.
func TestDocsNameTheChartsObjects(t *testing.T) {
	out, err := helm(t, "template", "gpu", chartDir(), "--kube-version", "1.37.2", "--namespace", "gpu-platform",
		"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
		"--set", "uninstall.cleanup=true", "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rendered := map[string]bool{}
	for _, doc := range strings.Split(out, "\n---") {
		var obj struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		rendered[obj.Metadata.Name] = true
	}
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`<(release|fullname)>-[a-z][-a-z]*[a-z]`)
	for _, path := range append(docs, "../README.md", filepath.Join(chartDir(), "values.yaml"), "../cmd/kubectl-loom/root.go") {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range named.FindAllString(string(text), -1) {
			suffix := name[strings.Index(name, ">")+1:]
			if name == "<release>-loom" {
				continue // the full name itself
			}
			if strings.HasPrefix(name, "<release>") {
				t.Errorf("%s names %s: the chart names its objects <fullname>%s", path, name, suffix)
			} else if !rendered["gpu-loom"+suffix] {
				t.Errorf("%s names %s, which the chart does not render (no gpu-loom%s for release gpu)", path, name, suffix)
			}
		}
	}
}
