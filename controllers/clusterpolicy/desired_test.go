package clusterpolicy

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the code")

// representativePolicy sets a little of everything: images, pull secrets,
// env, resources, selectors, shared labels and tolerations, time-slicing,
// the standalone DCGM on, the node status exporter off.
func representativePolicy() *gpuv1alpha1.ClusterPolicy {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gpu-stack", UID: "5f3c0e2a-policy-uid"}}
	s := &cp.Spec
	s.DaemonSets = gpuv1alpha1.DaemonSetsSpec{PriorityClassName: "system-node-critical",
		Labels: map[string]string{"team": "platform"}, Annotations: map[string]string{"example.com/owner": "gpu-team"},
		Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}}
	s.Driver.Image.Version = "580.65.06"
	s.Driver.Env = []corev1.EnvVar{{Name: "KERNEL_MODULE_TYPE", Value: "open"}}
	s.Driver.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}}
	s.Driver.UpgradePolicy = gpuv1alpha1.DriverUpgradePolicy{AutoUpgrade: ptr.To(true), MaxParallelUpgrades: ptr.To[int32](2), MaxUnavailable: ptr.To(intstr.FromString("25%"))}
	s.Toolkit.Image = gpuv1alpha1.ImageSpec{Repository: "registry.example/nvidia", Version: "v1.18.0", PullSecrets: []string{"regcred"}}
	s.DevicePlugin.Config = &gpuv1alpha1.DevicePluginConfig{TimeSlicing: &gpuv1alpha1.TimeSlicingSpec{Resources: []gpuv1alpha1.TimeSlicingResource{{Name: "nvidia.com/gpu", Replicas: 4}}}}
	s.DevicePlugin.Args = []string{"--fail-on-init-error=false"}
	s.DCGM.Enabled = ptr.To(true)
	s.DCGMExporter.MetricsConfigMapName = "my-counters"
	s.DCGMExporter.NodeSelector = map[string]string{"monitoring": "on"}
	s.MIG.Strategy = gpuv1alpha1.MIGStrategyMixed
	s.MIGManager = gpuv1alpha1.MIGManagerSpec{ConfigMapName: "mig-layouts", DefaultConfig: "all-disabled"}
	s.NodeStatusExporter.Enabled = ptr.To(false)
	return cp
}

// Every child of a representative policy, as a golden file: go test
// -run TestDesiredGolden -update rewrites it; review the diff.
func TestDesiredGolden(t *testing.T) {
	var b bytes.Buffer
	for _, obj := range desired(representativePolicy(), "loom-system") {
		u, err := apply.ToUnstructured(obj) // what the writer applies, before its owner reference and hash
		if err != nil {
			t.Fatal(err)
		}
		y, err := yaml.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	path := filepath.Join("testdata", "desired.golden.yaml")
	if *update {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run TestDesiredGolden -update writes it)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("desired children differ from %s; rerun with -update and review the diff:\n%s", path, b.String())
	}
}

// A pod template's hash is what the driver upgrade compares, and a
// changed template restarts the operand on every node: a Loom upgrade must
// not move them by accident. These are the hashes of spec: {} since the
// template was introduced; change them only on purpose.
func TestTemplateHashesAreStable(t *testing.T) {
	want := map[string]string{
		gpuv1alpha1.OperandDriver:             "c62be889d4781a4d",
		gpuv1alpha1.OperandToolkit:            "9a021e7d68714123",
		gpuv1alpha1.OperandValidator:          "a7cc5dcc918a9013",
		gpuv1alpha1.OperandDevicePlugin:       "624eb836d15be9e3",
		gpuv1alpha1.OperandDCGM:               "4130989bb3143811",
		gpuv1alpha1.OperandDCGMExporter:       "72c0096e3c539d32",
		gpuv1alpha1.OperandMIGManager:         "6434442b7452c611",
		gpuv1alpha1.OperandNodeStatusExporter: "0f409936cfad2f21",
	}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	for _, op := range operands {
		if got := BuildDaemonSet(op, cp, "loom-system").Spec.Template.Annotations[gpuv1alpha1.AnnotationTemplateHash]; got != want[op.name] {
			t.Errorf("%s template hash %s, want %s", op.name, got, want[op.name])
		}
	}
}

func names(objs []client.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, fmt.Sprintf("%T %s", o, client.ObjectKeyFromObject(o)))
	}
	slices.Sort(out)
	return out
}

// What a policy does not want is removed: a disabled operand's every
// child, and the time-slicing ConfigMap once time-slicing or the device
// plugin is off; nothing wanted is ever in that list.
func TestUndesired(t *testing.T) {
	rep := representativePolicy()
	noPlugin := rep.DeepCopy()
	noPlugin.Spec.DevicePlugin.Enabled = ptr.To(false)
	tests := []struct {
		name        string
		cp          *gpuv1alpha1.ClusterPolicy
		gone, stays []string
	}{
		{"defaults", &gpuv1alpha1.ClusterPolicy{},
			[]string{"*v1.DaemonSet loom-system/loom-dcgm", "*v1.ServiceAccount loom-system/loom-node-status-exporter",
				"*v1.ClusterRole /loom-system-loom-node-status-exporter", "*v1.ConfigMap loom-system/loom-device-plugin-config",
				"*v1.Role loom-system/loom-driver"},
			[]string{"*v1.DaemonSet loom-system/loom-driver", "*v1.ClusterRole /loom-system-loom-driver", "*v1.Role loom-system/loom-mig-manager"}},
		{"representative", rep,
			[]string{"*v1.DaemonSet loom-system/loom-node-status-exporter", "*v1.ClusterRoleBinding /loom-system-loom-node-status-exporter"},
			[]string{"*v1.ConfigMap loom-system/loom-device-plugin-config", "*v1.DaemonSet loom-system/loom-dcgm"}},
		{"device plugin off", noPlugin,
			[]string{"*v1.ConfigMap loom-system/loom-device-plugin-config", "*v1.DaemonSet loom-system/loom-device-plugin"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := desired(tt.cp, "loom-system")
			gone := names(undesired("loom-system", want))
			for _, g := range tt.gone {
				if !slices.Contains(gone, g) {
					t.Errorf("%s not removed (removed: %v)", g, gone)
				}
			}
			for _, w := range append(names(want), tt.stays...) {
				if slices.Contains(gone, w) {
					t.Errorf("%s both wanted and removed", w)
				}
			}
			if len(gone)+len(want) != 6*len(operands)+2 {
				t.Errorf("%d removed + %d wanted: not every possible child is accounted for", len(gone), len(want))
			}
		})
	}
}
