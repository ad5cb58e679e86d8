package clusterpolicy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// spec: {} is accepted and defaulted into a working stack.
func TestClusterPolicyEmptySpecIsDefaulted(t *testing.T) {
	ctx := context.Background()
	u := policy(t, "defaults", "{}")
	if err := env.Client.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Client.Delete(ctx, u) }()
	cp := &gpuv1alpha1.ClusterPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "defaults"}, cp); err != nil {
		t.Fatal(err)
	}
	up := cp.Spec.Driver.UpgradePolicy
	if !up.AutoUpgradeEnabled() || up.MaxParallelUpgrades == nil || *up.MaxParallelUpgrades != 1 || up.MaxUnavailable == nil || up.MaxUnavailable.String() != "25%" {
		t.Errorf("driver upgrade policy defaults = %+v", up)
	}
	if cp.Spec.MIG.Strategy != gpuv1alpha1.MIGStrategySingle || cp.Spec.MIGManager.DefaultConfig != "all-disabled" ||
		cp.Spec.DaemonSets.PriorityClassName != "system-node-critical" {
		t.Errorf("defaults: mig %q, mig manager %q, priority class %q", cp.Spec.MIG.Strategy, cp.Spec.MIGManager.DefaultConfig, cp.Spec.DaemonSets.PriorityClassName)
	}
	for _, d := range gpuv1alpha1.Defaults {
		img, ref := cp.Spec.Operand(d.Name).EffectiveImage(d.OperandDefaults)
		if img.Version == "" || !strings.Contains(ref, ":") {
			t.Errorf("%s: effective image %q", d.Name, ref)
		}
	}
}

func TestClusterPolicyValidation(t *testing.T) {
	tests := []struct {
		name, spec, wantErr string
	}{
		{"percent over 100", `{driver: {upgradePolicy: {maxUnavailable: "150%"}}}`, "maxUnavailable must be a non-negative integer or a percentage"},
		{"not a percent", `{driver: {upgradePolicy: {maxUnavailable: "half"}}}`, "maxUnavailable must be a non-negative integer or a percentage"},
		{"negative count", `{driver: {upgradePolicy: {maxUnavailable: -1}}}`, "maxUnavailable must be a non-negative integer or a percentage"},
		{"negative parallel", `{driver: {upgradePolicy: {maxParallelUpgrades: -1}}}`, "maxParallelUpgrades"},
		{"custom image without version", `{driver: {image: {repository: "registry.example/nvidia"}}}`, "a custom repository or image needs a version"},
		{"bad version", `{driver: {image: {version: "570 beta"}}}`, "version"},
		{"bad pull policy", `{toolkit: {image: {pullPolicy: Sometimes}}}`, "pullPolicy"},
		{"one replica is no sharing", `{devicePlugin: {config: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}}}`, "replicas"},
		{"unknown resource", `{devicePlugin: {config: {timeSlicing: {resources: [{name: nvidia.com/tpu, replicas: 4}]}}}}`, "name"},
		{"both configs", `{devicePlugin: {config: {configMapName: cfg, timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}}}`, "set either timeSlicing or configMapName, not both"},
		{"default without map", `{devicePlugin: {config: {defaultConfig: a100}}}`, "defaultConfig names a key of configMapName, which is not set"},
		{"bad MIG strategy", `{mig: {strategy: sometimes}}`, "strategy"},
	}
	ok := []string{
		`{driver: {upgradePolicy: {maxUnavailable: "100%", maxParallelUpgrades: 0}}}`,
		`{driver: {upgradePolicy: {maxUnavailable: 3}, image: {version: "580.65.06"}}}`,
		`{driver: {image: {repository: "registry.example/nvidia", version: "570.172.08-ubuntu22.04"}}}`,
		`{devicePlugin: {config: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}, {name: nvidia.com/mig-1g.10gb, replicas: 2}]}}}}`,
		`{devicePlugin: {config: {configMapName: sharing, defaultConfig: any}}, mig: {strategy: mixed}, dcgm: {enabled: true}}`,
	}
	ctx := context.Background()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := env.Client.Create(ctx, policy(t, fmt.Sprintf("bad-%d", i), tt.spec))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("spec %s: error %v, want one mentioning %q", tt.spec, err, tt.wantErr)
			}
		})
	}
	for i, spec := range ok {
		u := policy(t, fmt.Sprintf("ok-%d", i), spec)
		if err := env.Client.Create(ctx, u); err != nil {
			t.Errorf("valid spec %s rejected: %v", spec, err)
			continue
		}
		_ = env.Client.Delete(ctx, u)
	}
}

func policy(t *testing.T, name, spec string) *unstructured.Unstructured {
	t.Helper()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		t.Fatalf("test spec %s: %v", spec, err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": s}}
	u.SetAPIVersion(gpuv1alpha1.GroupVersion.String())
	u.SetKind("ClusterPolicy")
	u.SetName(name)
	return u
}
