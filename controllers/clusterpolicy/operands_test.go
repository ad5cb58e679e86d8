package clusterpolicy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
)

// Each operand waits on the node for what it depends on: the driver
// manager readies the node for the driver, the toolkit validates the
// driver first, everything after it waits for the toolkit.
func TestOperandOrdering(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	want := map[string]string{
		"driver": "k8s-driver-manager", "operator-validator": "", "container-toolkit": "driver-validation",
		"device-plugin": "wait-for-toolkit", "dcgm": "wait-for-toolkit", "dcgm-exporter": "wait-for-toolkit",
		"mig-manager": "wait-for-toolkit", "node-status-exporter": "wait-for-toolkit",
	}
	for _, op := range operands {
		ds := BuildDaemonSet(op, cp, "loom-system")
		var got string
		if ic := ds.Spec.Template.Spec.InitContainers; len(ic) > 0 {
			got = ic[0].Name
		}
		if got != want[op.name] {
			t.Errorf("%s init container %q, want %q", op.name, got, want[op.name])
		}
	}
}

// The operands that wait for the validator's toolkit-ready marker are
// the API's AfterToolkit, which may run only with the validator.
func TestAfterToolkitWaitForTheValidator(t *testing.T) {
	var waiting []string
	for _, op := range operands {
		if op.waitFor == "toolkit-ready" {
			waiting = append(waiting, op.name)
		}
	}
	if strings.Join(waiting, ",") != strings.Join(gpuv1alpha1.AfterToolkit, ",") {
		t.Errorf("operands waiting for toolkit-ready %v, AfterToolkit %v", waiting, gpuv1alpha1.AfterToolkit)
	}
}

// The toolkit's driver validation finds a driver installed on the host
// (nvidia.com/gpu.deploy.driver=pre-installed, where Loom runs no driver
// container) where nvidia-validator looks for it, in the host's root at
// /host, and links the NVIDIA devices into the host's /dev/char, as GPU
// Operator's: without them it waits for ever for a driver container's.
func TestDriverValidationSeesTheHostsDriver(t *testing.T) {
	spec := BuildDaemonSet(operandByName(gpuv1alpha1.OperandToolkit), &gpuv1alpha1.ClusterPolicy{}, "ns").Spec.Template.Spec
	paths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			paths[v.Name] = v.HostPath.Path
		}
	}
	want := map[string]string{"/host": "/", "/host-dev-char": "/dev/char", "/run/nvidia": "/run/nvidia"}
	for _, m := range spec.InitContainers[0].VolumeMounts {
		if host, ok := want[m.MountPath]; ok && paths[m.Name] == host && (m.MountPath != "/host" || m.ReadOnly) {
			delete(want, m.MountPath)
		}
	}
	if len(want) > 0 {
		t.Errorf("%s mounts %+v (volumes %v); want the host's %v (the root read-only)", spec.InitContainers[0].Name, spec.InitContainers[0].VolumeMounts, paths, want)
	}
}

// The toolkit configures containerd (its installer's default is docker),
// through the config and socket of the host's it mounts, with the host's
// PIDs to signal it, and for the driver root the driver validation found:
// Loom's driver container's, or a driver installed on the host (the
// validator's driver-ready marker says so, or, from older validators,
// host-driver-ready). Its script runs here with a stand-in installer.
func TestToolkitConfiguresContainerdForTheDriverRoot(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	cp.Spec.Toolkit.Args = []string{"--cdi-enabled"}
	spec := BuildDaemonSet(operandByName(gpuv1alpha1.OperandToolkit), cp, "ns").Spec.Template.Spec
	c := spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = true
	}
	if env["RUNTIME"] != "containerd" || !spec.HostPID || !mounts[filepath.Dir(env["CONTAINERD_CONFIG"])] || !mounts[filepath.Dir(env["CONTAINERD_SOCKET"])] || !mounts["/host"] {
		t.Errorf("toolkit env %v, mounts %v, hostPID %v: want containerd's config and socket mounted, the host's PIDs and root", env, mounts, spec.HostPID)
	}
	if len(c.Command) == 0 {
		t.Fatalf("the toolkit runs its installer without a driver root")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nvidia-toolkit"), []byte("#!/bin/sh\necho \"$NVIDIA_DRIVER_ROOT $DRIVER_ROOT_CTR_PATH $*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	container, host := "/run/nvidia/driver /run/nvidia/driver --cdi-enabled /usr/local/nvidia", "/ /host --cdi-enabled /usr/local/nvidia"
	for _, tc := range []struct {
		markers map[string]string
		want    string
	}{
		{map[string]string{"driver-ready": "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\nDRIVER_ROOT_CTR_PATH=/run/nvidia/driver\n"}, container},
		{map[string]string{"driver-ready": "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\n"}, host},
		{map[string]string{"driver-ready": ""}, container},
		{map[string]string{"driver-ready": "", "host-driver-ready": ""}, host},
	} {
		validations := t.TempDir()
		for f, content := range tc.markers {
			if err := os.WriteFile(filepath.Join(validations, f), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		args := append(slices.Clone(c.Command[1:]), c.Args...)
		args[1] = strings.ReplaceAll(args[1], validationsDir, validations)
		out, err := exec.Command(c.Command[0], args...).CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || got != tc.want {
			t.Errorf("markers %q: the installer ran with %q (%v), want %q", tc.markers, got, err, tc.want)
		}
	}
}

// Config changes move exactly the affected operand's pod-template hash.
func TestConfigHashTouchesOnlyTheAffectedOperand(t *testing.T) {
	base := &gpuv1alpha1.ClusterPolicy{Spec: gpuv1alpha1.ClusterPolicySpec{MIG: gpuv1alpha1.MIGSpec{Strategy: gpuv1alpha1.MIGStrategySingle}}}
	changed := base.DeepCopy()
	changed.Spec.MIG.Strategy = gpuv1alpha1.MIGStrategyMixed
	changed.Spec.DevicePlugin.Config = &gpuv1alpha1.DevicePluginConfig{TimeSlicing: &gpuv1alpha1.TimeSlicingSpec{
		Resources: []gpuv1alpha1.TimeSlicingResource{{Name: "nvidia.com/gpu", Replicas: 4}}}}
	for _, op := range operands {
		a := apply.Hash(BuildDaemonSet(op, base, "ns").Spec)
		b := apply.Hash(BuildDaemonSet(op, changed, "ns").Spec)
		if (a != b) != (op.name == "device-plugin") {
			t.Errorf("%s: spec changed = %v", op.name, a != b)
		}
	}
	ds := BuildDaemonSet(operandByName("device-plugin"), changed, "ns")
	pod := ds.Spec.Template.Spec
	if !hasConfigVolume(pod.Volumes) {
		t.Errorf("device plugin has no config volume: %+v", pod.Volumes)
	}
	cm := DevicePluginConfigMap(changed, "ns")
	if cm == nil || !strings.Contains(cm.Data["config.yaml"], "migStrategy: mixed") {
		t.Fatalf("config map %+v", cm)
	}
	if DevicePluginConfigMap(base, "ns") != nil {
		t.Error("config map without time-slicing")
	}
}

func hasConfigVolume(vs []corev1.Volume) bool {
	for _, v := range vs {
		if v.ConfigMap != nil {
			return true
		}
	}
	return false
}

func TestOperandImagesAndOverrides(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	cp.Spec.Driver.Image.Version = "580.65.06"
	cp.Spec.Toolkit.Image = gpuv1alpha1.ImageSpec{Repository: "registry.example/nvidia", Version: "v1.18.0", PullSecrets: []string{"regcred"}}
	cp.Spec.DevicePlugin.Enabled = ptr.To(false)
	if img := BuildDaemonSet(operandByName("driver"), cp, "ns").Spec.Template.Spec.Containers[0].Image; img != "nvcr.io/nvidia/driver:580.65.06" {
		t.Errorf("driver image %s", img)
	}
	tk := BuildDaemonSet(operandByName("container-toolkit"), cp, "ns").Spec.Template.Spec
	if tk.Containers[0].Image != "registry.example/nvidia/container-toolkit:v1.18.0" || len(tk.ImagePullSecrets) != 1 {
		t.Errorf("toolkit image %s, secrets %v", tk.Containers[0].Image, tk.ImagePullSecrets)
	}
	on, off := enabledOperands(cp)
	if len(on) != 5 || len(off) != 3 {
		t.Errorf("%d on, %d off", len(on), len(off))
	}
}

// dcgm-exporter is Ready only once it serves its /health on the metrics
// port (GPU Operator's probe), and restarted if it stops: a rollout of an
// exporter that cannot start stops at its first node (a DaemonSet's
// rolling update waits for each new pod to be Ready), and the component
// reads ready only where one serves.
func TestDCGMExporterReadyOnceItServes(t *testing.T) {
	c := BuildDaemonSet(operandByName(gpuv1alpha1.OperandDCGMExporter), &gpuv1alpha1.ClusterPolicy{}, "ns").Spec.Template.Spec.Containers[0]
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" || p.HTTPGet.Port.String() != c.Ports[0].Name {
			t.Errorf("dcgm-exporter %s probe %+v, want GET /health on port %s", name, p, c.Ports[0].Name)
		}
	}
}

// dcgm-exporter reads Loom's counters (with the ECC fields the alerts need)
// unless the policy names its own ConfigMap; switching restarts it.
func TestDCGMExporterCounters(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	ds := BuildDaemonSet(operandByName(gpuv1alpha1.OperandDCGMExporter), cp, "ns")
	pod := ds.Spec.Template.Spec
	var cm string
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil {
			cm = v.ConfigMap.Name
		}
	}
	if cm != gpuv1alpha1.DefaultDCGMCountersConfigMap {
		t.Fatalf("counters volume from ConfigMap %q, want %q", cm, gpuv1alpha1.DefaultDCGMCountersConfigMap)
	}
	var collectors string
	for _, e := range pod.Containers[0].Env {
		if e.Name == "DCGM_EXPORTER_COLLECTORS" {
			collectors = e.Value
		}
	}
	var mounted bool
	for _, m := range pod.Containers[0].VolumeMounts {
		mounted = mounted || (m.Name == "counters" && collectors == m.MountPath+"/dcgm-metrics.csv")
	}
	if !mounted {
		t.Errorf("DCGM_EXPORTER_COLLECTORS=%q is not the mounted counters file (%+v)", collectors, pod.Containers[0].VolumeMounts)
	}
	own := cp.DeepCopy()
	own.Spec.DCGMExporter.MetricsConfigMapName = "my-counters"
	ds2 := BuildDaemonSet(operandByName(gpuv1alpha1.OperandDCGMExporter), own, "ns")
	if own.Spec.DCGMExporter.CountersConfigMap() != "my-counters" || ds2.Spec.Template.Annotations[gpuv1alpha1.AnnotationConfigHash] == ds.Spec.Template.Annotations[gpuv1alpha1.AnnotationConfigHash] {
		t.Errorf("naming a ConfigMap must switch the volume and restart the exporters")
	}
}

// A variable of the policy's env that Loom also sets replaces Loom's
// value instead of naming it twice (an apply the API server refuses:
// a container's env is a list keyed by name).
func TestPolicyEnvOverridesBuiltIn(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	cp.Spec.DevicePlugin.Env = []corev1.EnvVar{{Name: "MIG_STRATEGY", Value: "mixed"}, {Name: "NODE_NAME", Value: "n"}, {Name: "EXTRA", Value: "1"}}
	cp.Spec.Driver.Env = []corev1.EnvVar{{Name: "KERNEL_MODULE_TYPE", Value: "open"}}
	for _, op := range operands {
		env := BuildDaemonSet(op, cp, "ns").Spec.Template.Spec.Containers[0].Env
		seen := map[string]string{}
		for _, e := range env {
			if _, dup := seen[e.Name]; dup {
				t.Errorf("%s: env %s named twice: %+v", op.name, e.Name, env)
			}
			seen[e.Name] = e.Value
		}
		for _, want := range cp.Spec.Operand(op.name).Env {
			if seen[want.Name] != want.Value {
				t.Errorf("%s: env %s = %q, want the policy's %q", op.name, want.Name, seen[want.Name], want.Value)
			}
		}
	}
}

// The validator image's entrypoint is /bin/bash, which exits at once
// without a terminal: the validator and the node status exporter name
// their program, run here with a stand-in nvidia-validator and sleep. The
// validator validates the toolkit (writing the toolkit-ready marker the
// later operands wait for), with the policy's args, then stays up; the
// node status exporter serves the metrics component.
func TestValidatorImageOperandsRunTheValidator(t *testing.T) {
	dir := t.TempDir()
	for name, script := range map[string]string{
		"nvidia-validator": `echo "nvidia-validator COMPONENT=$COMPONENT METRICS_PORT=$METRICS_PORT $*"`,
		"sleep":            `echo "sleep $*"`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	cp := &gpuv1alpha1.ClusterPolicy{}
	cp.Spec.Validator.Args = []string{"--sleep-interval-seconds=2"}
	cp.Spec.NodeStatusExporter.Enabled = ptr.To(true)
	for op, want := range map[string]string{
		gpuv1alpha1.OperandValidator: "nvidia-validator COMPONENT=toolkit METRICS_PORT= --sleep-interval-seconds=2\n" +
			"all validations are successful\nsleep infinity\n",
		gpuv1alpha1.OperandNodeStatusExporter: "nvidia-validator COMPONENT=metrics METRICS_PORT=8000 \n",
	} {
		c := BuildDaemonSet(operandByName(op), cp, "ns").Spec.Template.Spec.Containers[0]
		if len(c.Command) == 0 {
			t.Errorf("%s runs its image's entrypoint (/bin/bash), which does nothing", op)
			continue
		}
		cmd := exec.Command(c.Command[0], append(c.Command[1:], c.Args...)...)
		cmd.Env = os.Environ()
		for _, e := range c.Env {
			cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
		}
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != want {
			t.Errorf("%s ran %q: %v\n%s\nwant\n%s", op, cmd.Args, err, out, want)
		}
	}
}

// The driver pod is Ready only once its driver answers: a startup probe
// runs nvidia-smi before it writes the marker the validator's driver check
// waits for (GPU Operator's .driver-ctr-ready), and stopping removes the
// marker. The driver upgrade's validation step waits for that readiness.
// Both stay outside the template hash (TestTemplateHashesAreStable): a
// Loom upgrade restarts no driver for them.
func TestDriverReadyOnlyOnceItsDriverAnswers(t *testing.T) {
	cp := &gpuv1alpha1.ClusterPolicy{}
	c := BuildDaemonSet(operandByName(gpuv1alpha1.OperandDriver), cp, "ns").Spec.Template.Spec.Containers[0]
	p := c.StartupProbe
	if p == nil || p.Exec == nil {
		t.Fatalf("driver container without a startup probe: Ready as soon as it starts, its driver still building")
	}
	probe := strings.Join(p.Exec.Command, " ")
	smi, marker := strings.Index(probe, "nvidia-smi &&"), strings.Index(probe, "touch /run/nvidia/validations/.driver-ctr-ready")
	if smi < 0 || marker < smi {
		t.Errorf("startup probe %q: want nvidia-smi, then the marker", probe)
	}
	if p.FailureThreshold*p.PeriodSeconds < 20*60 {
		t.Errorf("startup probe gives the driver %ds to build, want at least 20 minutes", p.FailureThreshold*p.PeriodSeconds)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil ||
		!strings.Contains(strings.Join(c.Lifecycle.PreStop.Exec.Command, " "), "rm -f /run/nvidia/validations/.driver-ctr-ready") {
		t.Errorf("driver container lifecycle %+v: stopping must remove the marker", c.Lifecycle)
	}
}
