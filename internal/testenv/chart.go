package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// RenderChart renders charts/loom with `helm template` as release "loom" in
// namespace, with extra --set values, and returns the objects (CRDs
// excluded).
func RenderChart(namespace string, set ...string) ([]*unstructured.Unstructured, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	helmDir, err := ToolDir("helm")
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "loom-helm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	args := []string{"template", "loom", filepath.Join(root, "charts", "loom"), "--namespace", namespace, "--kube-version", "1.37.2"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(helmDir, "helm"), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+tmp, "HELM_CONFIG_HOME="+tmp, "HELM_DATA_HOME="+tmp)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm template: %w\n%s", err, stderr.String())
	}
	f := filepath.Join(tmp, "rendered.yaml")
	if err := os.WriteFile(f, stdout.Bytes(), 0o600); err != nil {
		return nil, err
	}
	return ReadManifests(f)
}
