package clusterpolicy

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
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
	s.Driver.KernelModuleType = "open"
	s.Driver.Env = []corev1.EnvVar{{Name: "DRIVER_LOG_LEVEL", Value: "debug"}}
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

// sharingPolicy runs precompiled drivers and reads the user's ConfigMaps:
// the device plugin's named configs (with the config manager), the
// built-in MIG layouts.
func sharingPolicy() *gpuv1alpha1.ClusterPolicy {
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gpu-stack", UID: "5f3c0e2a-policy-uid"}}
	cp.Spec.Driver.UsePrecompiled = true
	cp.Spec.DevicePlugin.Config = &gpuv1alpha1.DevicePluginConfig{ConfigMapName: "sharing", DefaultConfig: "a100"}
	return cp
}

// Every child of a representative policy (and of one sharing GPUs through
// ConfigMaps), for a fleet of two OSes, as golden files: go test
// -run TestDesiredGolden -update rewrites them; review the diff.
func TestDesiredGolden(t *testing.T) {
	for file, cp := range map[string]*gpuv1alpha1.ClusterPolicy{"desired.golden.yaml": representativePolicy(), "sharing.golden.yaml": sharingPolicy()} {
		t.Run(file, func(t *testing.T) { checkGolden(t, file, cp) })
	}
}

func checkGolden(t *testing.T, file string, cp *gpuv1alpha1.ClusterPolicy) {
	var b bytes.Buffer
	for _, obj := range desired(cp, "loom-system", testFleet()).objects {
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
	path := filepath.Join("testdata", file)
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
// template was introduced; change them only on purpose. (The driver's
// moved with KERNEL_MODULE_TYPE, the MIG manager's with its mounted
// config, the validator's and the node status exporter's with the command
// that runs nvidia-validator, the toolkit's with the host's root its driver
// validation reads and with containerd and the driver root it configures,
// dcgm-exporter's with its /health probe.)
func TestTemplateHashesAreStable(t *testing.T) {
	want := map[string]string{
		gpuv1alpha1.OperandDriver:             "2dec423ca06fae91",
		gpuv1alpha1.OperandToolkit:            "41f119d0a84f7eef",
		gpuv1alpha1.OperandValidator:          "4a1cf3d0e0edff7f",
		gpuv1alpha1.OperandDevicePlugin:       "624eb836d15be9e3",
		gpuv1alpha1.OperandDCGM:               "4130989bb3143811",
		gpuv1alpha1.OperandDCGMExporter:       "475360d4e64bfa1f",
		gpuv1alpha1.OperandMIGManager:         "dd029c827afbc17b",
		gpuv1alpha1.OperandNodeStatusExporter: "fb240e0f32d21875",
	}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	for _, op := range operands {
		if got := BuildDaemonSet(op, cp, "loom-system").Spec.Template.Annotations[gpuv1alpha1.AnnotationTemplateHash]; got != want[op.name] {
			t.Errorf("%s template hash %s, want %s", op.name, got, want[op.name])
		}
	}
}

// testFleet is GPU nodes of two OSes (one known by NFD's labels, one by
// its osImage), a third OS sharing the first's images, and nodes without a
// driver: unknown and unsupported OSes.
func testFleet() cluster {
	node := func(name, osImage, kernel string, labels map[string]string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{OSImage: osImage, KernelVersion: kernel}}}
	}
	nfd := map[string]string{gpuv1alpha1.LabelOSReleaseID: "ubuntu", gpuv1alpha1.LabelOSReleaseVersionID: "22.04"}
	cms := map[string]*corev1.ConfigMap{}
	for name, key := range map[string]string{"mig-layouts": "config.yaml", "my-counters": gpuv1alpha1.DCGMCountersKey, "sharing": "a100"} {
		cms[name] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "loom-system"}, Data: map[string]string{key: name + " content"}}
	}
	return cluster{configMaps: cms, nodes: []corev1.Node{
		node("gpu-a", "Ubuntu 22.04.4 LTS", "5.15.0-105-generic", nfd),
		node("gpu-b", "Ubuntu 22.04.5 LTS", "5.15.0-105-generic", nil),
		node("gpu-c", "Red Hat Enterprise Linux 9.4 (Plow)", "5.14.0-427.13.1.el9_4.x86_64", nil),
		node("gpu-d", "", "", nil),
		node("gpu-e", "Debian GNU/Linux 12 (bookworm)", "6.1.0-18-amd64", nil),
	}}
}

func (p plan) drivers() []string {
	var out []string
	for _, o := range p.objects {
		if ds, ok := o.(*appsv1.DaemonSet); ok && ds.Labels[gpuv1alpha1.LabelComponent] == gpuv1alpha1.OperandDriver {
			out = append(out, ds.Name)
		}
	}
	return out
}

// plainDriver is the per-OS driver DaemonSets beyond the one plain name
// every policy can have.
func plainDriver(p plan) int {
	n := len(p.drivers())
	if slices.Contains(p.drivers(), "loom-driver") {
		n--
	}
	return n
}

func dsNames(objs []client.Object) []string {
	var out []string
	for _, o := range objs {
		if _, ok := o.(*appsv1.DaemonSet); ok {
			out = append(out, o.GetName())
		}
	}
	return out
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
			[]string{"*v1.DaemonSet loom-system/loom-driver-ubuntu22.04", "*v1.DaemonSet loom-system/loom-driver-rhel9.4",
				"*v1.ClusterRole /loom-system-loom-driver", "*v1.Role loom-system/loom-mig-manager", "*v1.ConfigMap loom-system/loom-mig-parted-config"}},
		{"representative", rep,
			[]string{"*v1.DaemonSet loom-system/loom-node-status-exporter", "*v1.ClusterRoleBinding /loom-system-loom-node-status-exporter"},
			[]string{"*v1.ConfigMap loom-system/loom-device-plugin-config", "*v1.DaemonSet loom-system/loom-dcgm"}},
		{"device plugin off", noPlugin,
			[]string{"*v1.ConfigMap loom-system/loom-device-plugin-config", "*v1.DaemonSet loom-system/loom-device-plugin"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := desired(tt.cp, "loom-system", testFleet())
			want := p.objects
			gone := names(undesired("loom-system", p, nil))
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
			// The driver's one plain name is replaced by one per OS.
			if len(gone)+len(want) != 6*len(operands)+3+plainDriver(p) {
				t.Errorf("%d removed + %d wanted: not every possible child is accounted for", len(gone), len(want))
			}
		})
	}
}
