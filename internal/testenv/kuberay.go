package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"sigs.k8s.io/yaml"
)

// KubeRaySample reads one of KubeRay's own sample RayClusters
// (config/samples/<file>) from the ray-operator module Loom builds against,
// into namespace ns.
func KubeRaySample(file, ns string) (*rayv1.RayCluster, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ray-project/kuberay/ray-operator").Output()
	if err != nil {
		return nil, fmt.Errorf("locating the ray-operator module: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "config", "samples", file))
	if err != nil {
		return nil, err
	}
	rc := &rayv1.RayCluster{}
	if err := yaml.Unmarshal(b, rc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	rc.Namespace = ns
	return rc, nil
}
