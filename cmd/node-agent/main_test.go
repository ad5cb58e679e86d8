package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/manager"
)

func runOnce(t *testing.T, args ...string) (gpuv1alpha1.GPUNodeStatus, int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"--once", "--log-level=error"}, args...), &stdout, &stderr)
	var st gpuv1alpha1.GPUNodeStatus
	if stdout.Len() > 0 {
		if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
			t.Fatalf("output is not a GPUNode status: %v\n%s", err, stdout.String())
		}
	}
	return st, code, stderr.String()
}

// On a machine without a driver, --once prints the PCI GPUs with NVML
// unavailable and exits 0.
func TestAgentOnceWithoutDriver(t *testing.T) {
	sysfs := t.TempDir()
	if err := inventory.WritePCITree(sysfs, []gpuv1alpha1.PCIDevice{
		{BusID: "0000:18:00.0", DeviceID: "0x2330"}, {BusID: "0000:2a:00.0", DeviceID: "0x2330"},
	}); err != nil {
		t.Fatal(err)
	}
	st, code, stderr := runOnce(t, "--sysfs-root", sysfs, "--driver-root", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	p := st.PCIDevices
	if len(p) != 2 || p[0].BusID != "0000:18:00.0" || p[1].BusID != "0000:2a:00.0" || p[1].DeviceID != "0x2330" ||
		p[0].Product != "NVIDIA H100 80GB HBM3" || st.GPUCount != 0 {
		t.Errorf("status %+v", st)
	}
	if !meta.IsStatusConditionTrue(st.Conditions, gpuv1alpha1.ConditionNVMLUnavailable) ||
		meta.IsStatusConditionTrue(st.Conditions, gpuv1alpha1.ConditionReady) {
		t.Errorf("conditions %+v", st.Conditions)
	}
}

func TestAgentOnceFailsWhenNothingReadable(t *testing.T) {
	_, code, stderr := runOnce(t, "--sysfs-root", t.TempDir()+"/none", "--driver-root", t.TempDir())
	if code != 1 || !strings.Contains(stderr, "nothing could be read") {
		t.Errorf("exit %d, stderr %s", code, stderr)
	}
}

// A simulation without --sysfs-root reads a fabricated PCI bus of its GPUs;
// a bare one has NVML unavailable until its driver library exists.
func TestAgentOnceSimulated(t *testing.T) {
	st, code, stderr := runOnce(t, "--simulate=dgx-h100", "--simulate-gpus=2", "--node-name=n")
	if code != 0 || st.GPUCount != 2 || len(st.PCIDevices) != 2 || st.PCIDevices[0].BusID != st.GPUs[0].PCIBusID || st.Simulated != "dgx-h100" {
		t.Errorf("exit %d (%s): %+v", code, stderr, st)
	}
	st, code, stderr = runOnce(t, "--simulate=dgx-a100", "--simulate-bare", "--driver-root", t.TempDir())
	if code != 0 || st.GPUCount != 0 || len(st.PCIDevices) != 8 || !meta.IsStatusConditionTrue(st.Conditions, gpuv1alpha1.ConditionNVMLUnavailable) {
		t.Errorf("bare: exit %d (%s): %+v", code, stderr, st)
	}
}

func TestAgentFlags(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--simulate=dgx-a100", "--simulate-bare"}, "--simulate-bare needs --driver-root"},
		{[]string{"--simulate-bare", "--driver-root=/x"}, "need --simulate"},
		{[]string{"--simulate-mig-file=/x"}, "need --simulate"},
		{[]string{"--simulate-host-driver"}, "need --simulate"},
		{[]string{"--simulate=dgx-a100", "--simulate-bare", "--driver-root=/x", "--simulate-host-driver"}, "exclude each other"},
		{[]string{"--simulate=dgx-a100", "--simulate-mig=9g.9gb:1"}, "--simulate: "},
	} {
		_, code, stderr := runOnce(t, tt.args...)
		if code != 2 || !strings.Contains(stderr, tt.wantErr) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tt.args, code, stderr, tt.wantErr)
		}
	}
}

func TestAgentVersionAndHelp(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		wantCode int
		want     string
	}{
		{[]string{"--kubeconfig", "/no/such/kubeconfig", "--version"}, 0, "loom " + manager.Version()},
		{[]string{"-h"}, 0, "-simulate-mig-file"},
		{[]string{"--no-such-flag"}, 2, "flag provided but not defined: -no-such-flag"},
		{[]string{"--interval=10ms", "--node-name=n"}, 2, "--interval must be at least 1s"},
		{[]string{"--log-format=logfmt", "--node-name=n"}, 2, `--log-format must be json or text, got "logfmt"`},
		{[]string{"--node-name=n", "--once", "false", "--interval=10ms"}, 2, `unexpected argument "false"`},
	} {
		var out bytes.Buffer
		if code := run(context.Background(), tt.args, &out, &out); code != tt.wantCode || !strings.Contains(out.String(), tt.want) {
			t.Errorf("%v: exit %d, output %q; want %d and %q", tt.args, code, out.String(), tt.wantCode, tt.want)
		}
	}
}
