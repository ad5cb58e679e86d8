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
		{"latest", `{driver: {image: {version: latest}}}`, "driver.image.version must be a driver version"},
		{"no digits", `{driver: {image: {version: stable-ubuntu22.04}}}`, "driver.image.version must be a driver version"},
		{"precompiled with an OS suffix", `{driver: {usePrecompiled: true, image: {version: "570.172.08-ubuntu22.04"}}}`, "driver.usePrecompiled takes the branch"},
		{"unknown kernel module type", `{driver: {kernelModuleType: nouveau}}`, "kernelModuleType"},
		{"bad pull policy", `{toolkit: {image: {pullPolicy: Sometimes}}}`, "pullPolicy"},
		{"one replica is no sharing", `{devicePlugin: {config: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}}}`, "replicas"},
		{"unknown resource", `{devicePlugin: {config: {timeSlicing: {resources: [{name: nvidia.com/tpu, replicas: 4}]}}}}`, "name"},
		// No resource name holds a '+': the device plugin advertises the
		// 1g.10gb+me profile as nvidia.com/mig-1g.10gb.me.
		{"a MIG profile's '+' in a resource name", `{devicePlugin: {config: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.10gb+me, replicas: 2}]}}}}`, "name"},
		{"both configs", `{devicePlugin: {config: {configMapName: cfg, timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}}}`, "set either timeSlicing or configMapName, not both"},
		{"default without map", `{devicePlugin: {config: {defaultConfig: a100}}}`, "defaultConfig names a key of configMapName, which is not set"},
		{"bad MIG strategy", `{mig: {strategy: sometimes}}`, "strategy"},
		{"a priority class no PriorityClass can be named", `{daemonsets: {priorityClassName: "System_Node_Critical"}}`, "spec.daemonsets.priorityClassName"},
	}
	ok := []string{
		`{driver: {upgradePolicy: {maxUnavailable: "100%", maxParallelUpgrades: 0}}}`,
		`{driver: {upgradePolicy: {maxUnavailable: 3}, image: {version: "580.65.06"}}}`,
		`{driver: {image: {repository: "registry.example/nvidia", version: "570.172.08-ubuntu22.04"}}}`,
		`{driver: {usePrecompiled: true, kernelModuleType: open, image: {version: "570.172.08"}}}`,
		`{devicePlugin: {config: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}, {name: nvidia.com/mig-1g.10gb, replicas: 2}]}}}}`,
		`{devicePlugin: {config: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.10gb.me, replicas: 2}, {name: nvidia.com/mig-1g.23gb-me, replicas: 2}]}}}}`,
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

// Careless values are rejected at apply, each with a message naming its
// field; their valid neighbours are accepted.
func TestClusterPolicyRejectsCarelessValues(t *testing.T) {
	tests := []struct {
		name, spec string
		want       []string // all in the error
	}{
		{"driver version latest", `{driver: {image: {version: latest}}}`,
			[]string{"spec.driver.image.version", "driver.image.version must be a driver version"}},
		{"driver version without digits", `{driver: {image: {version: stable-ubuntu22.04}}}`,
			[]string{"spec.driver.image.version", "driver.image.version must be a driver version"}},
		{"driver version v-prefixed", `{driver: {image: {version: v570.172.08}}}`,
			[]string{"spec.driver.image.version", "driver.image.version must be a driver version"}},
		{"driver version major only", `{driver: {image: {version: "570"}}}`,
			[]string{"spec.driver.image.version", "driver.image.version must be a driver version"}},
		{"custom driver image, tag latest", `{driver: {image: {repository: registry.example/nvidia, version: latest}}}`,
			[]string{"spec.driver.image.version", "driver.image.version must be a driver version"}},
		{"maxUnavailable 0", `{driver: {upgradePolicy: {maxUnavailable: 0}}}`,
			[]string{"spec.driver.upgradePolicy.maxUnavailable", "maxUnavailable: 0 would never upgrade a node", "autoUpgrade: false"}},
		{"maxUnavailable 0%", `{driver: {upgradePolicy: {maxUnavailable: "0%"}}}`,
			[]string{"spec.driver.upgradePolicy.maxUnavailable", "maxUnavailable: 0 would never upgrade a node"}},
		{"drain selector unclosed", `{driver: {upgradePolicy: {drain: {enable: true, podSelector: "app in ("}}}}`,
			[]string{"spec.driver.upgradePolicy.drain.podSelector", "drain.podSelector must be a label selector"}},
		{"drain selector trailing comma", `{driver: {upgradePolicy: {drain: {podSelector: "app=x,"}}}}`,
			[]string{"spec.driver.upgradePolicy.drain.podSelector", "drain.podSelector must be a label selector"}},
		{"drain selector bad key", `{driver: {upgradePolicy: {drain: {podSelector: "Example.com/app=x"}}}}`,
			[]string{"spec.driver.upgradePolicy.drain.podSelector", "drain.podSelector must be a label selector"}},
		{"drain selector value too long", `{driver: {upgradePolicy: {drain: {podSelector: "app=` + strings.Repeat("x", 64) + `"}}}}`,
			[]string{"spec.driver.upgradePolicy.drain.podSelector", "drain.podSelector must be a label selector"}},
		{"wait selector garbage", `{driver: {upgradePolicy: {waitForCompletion: {podSelector: "job in batch"}}}}`,
			[]string{"spec.driver.upgradePolicy.waitForCompletion.podSelector", "waitForCompletion.podSelector must be a label selector"}},
		{"wait selector double operator", `{driver: {upgradePolicy: {waitForCompletion: {podSelector: "job===batch"}}}}`,
			[]string{"spec.driver.upgradePolicy.waitForCompletion.podSelector", "waitForCompletion.podSelector must be a label selector"}},
		{"repository with a scheme", `{toolkit: {image: {repository: "https://nvcr.io/nvidia", version: v1}}}`,
			[]string{"spec.toolkit.image.repository"}},
		{"repository upper case", `{devicePlugin: {image: {repository: "nvcr.io/NVIDIA", version: v1}}}`,
			[]string{"spec.devicePlugin.image.repository"}},
		{"image name with a tag", `{dcgmExporter: {image: {image: "dcgm-exporter:4.2", version: v1}}}`,
			[]string{"spec.dcgmExporter.image.image"}},
		{"a ConfigMap name no ConfigMap can have", `{migManager: {configMapName: "My Layouts"}}`,
			[]string{"spec.migManager.configMapName"}},
		{"a metrics ConfigMap name with a slash", `{dcgmExporter: {metricsConfigMapName: "loom-system/counters"}}`,
			[]string{"spec.dcgmExporter.metricsConfigMapName"}},
		{"a sharing ConfigMap name in upper case", `{devicePlugin: {config: {configMapName: Sharing}}}`,
			[]string{"spec.devicePlugin.config.configMapName"}},
		{"an env name twice", `{devicePlugin: {env: [{name: FOO, value: a}, {name: FOO, value: b}]}}`,
			[]string{"spec.devicePlugin.env[1]", "Duplicate value"}},
		{"validator off, the device plugin waiting for it", `{validator: {enabled: false}, dcgmExporter: {enabled: false}, migManager: {enabled: false}}`,
			[]string{"spec.validator.enabled", "toolkit-ready marker only the validator writes"}},
		{"validator off, the opt-in DCGM waiting for it", `{validator: {enabled: false}, devicePlugin: {enabled: false}, dcgmExporter: {enabled: false}, migManager: {enabled: false}, dcgm: {enabled: true}}`,
			[]string{"spec.validator.enabled"}},
		{"wait selector too long", `{driver: {upgradePolicy: {waitForCompletion: {podSelector: "` + strings.Repeat("a", 1025) + `"}}}}`,
			[]string{"spec.driver.upgradePolicy.waitForCompletion.podSelector", "1024"}},
	}
	ok := []string{
		`{driver: {upgradePolicy: {maxUnavailable: 1, drain: {enable: true, podSelector: "app in (training, serving),!canary,tier!=cpu"}}}}`,
		`{driver: {upgradePolicy: {maxUnavailable: "1%", waitForCompletion: {podSelector: "example.com/job=batch, gpus>4"}}}}`,
		`{driver: {image: {version: "550.54.15-rhel9.4"}, upgradePolicy: {maxParallelUpgrades: 0}}}`,
		`{driver: {upgradePolicy: {drain: {podSelector: "app"}, waitForCompletion: {podSelector: "!app"}}}}`,
		`{toolkit: {image: {version: latest}}}`, // only the driver's version is a driver version
		// Nothing waits for a validator that is off: a driver and toolkit alone.
		`{validator: {enabled: false}, devicePlugin: {enabled: false}, dcgmExporter: {enabled: false}, migManager: {enabled: false}}`,
		`{toolkit: {image: {repository: "registry.example:5000/mirror/nvidia", image: "k8s/container-toolkit", version: v1}}}`,
	}
	ctx := context.Background()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := env.Client.Create(ctx, policy(t, fmt.Sprintf("careless-%d", i), tt.spec))
			if err == nil {
				t.Fatalf("spec %s accepted", tt.spec)
			}
			t.Logf("rejected: %.400v", err)
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("spec %.120s: error %v\nwant one mentioning %q", tt.spec, err, w)
				}
			}
		})
	}
	for i, spec := range ok {
		u := policy(t, fmt.Sprintf("careful-%d", i), spec)
		if err := env.Client.Create(ctx, u); err != nil {
			t.Errorf("valid spec %s rejected: %v", spec, err)
			continue
		}
		_ = env.Client.Delete(ctx, u)
	}
	long := policy(t, strings.Repeat("p", 64), "{}")
	if err := env.Client.Create(ctx, long); err == nil || !strings.Contains(err.Error(), "metadata.name must be at most 63 characters") {
		t.Errorf("a 64-character ClusterPolicy name: %v", err)
	}
}
