package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/loom-dev/loom/internal/testenv"
)

// runOn runs kubectl loom with args against the API server of the
// kubeconfig file: its standard output, its standard error, its error.
func runOn(t *testing.T, kubeconfig string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append([]string{"--kubeconfig", kubeconfig}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// On a cluster without Loom (its CRDs not served, or no manager after a
// helm uninstall that left them), gpus and upgrades fail saying so, as why
// does, instead of an empty table that reads as a fleet without GPUs; with
// Loom and no GPU node they say that nothing matched (on standard error, as
// kubectl get does) instead of a table header.
func TestGPUsAndUpgradesWithoutLoom(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	own, err := testenv.StartWithout(ctx, "gpu.loom.dev", "training.loom.dev")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = own.Stop() }()
	kc := kubeconfigFor(t, own.Config)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gpus"}, "the cluster does not serve Loom's GPUNode CRD: is Loom installed?"},
		{[]string{"gpus", "-o", "json"}, "the cluster does not serve Loom's GPUNode CRD: is Loom installed?"},
		{[]string{"upgrades"}, "the cluster does not serve Loom's ClusterPolicy CRD: is Loom installed?"},
		{[]string{"upgrades", "-o", "yaml"}, "the cluster does not serve Loom's ClusterPolicy CRD: is Loom installed?"},
	} {
		out, _, err := runOn(t, kc, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || out != "" {
			t.Errorf("%v without Loom: err %v, want %q; printed %q", tc.args, err, tc.want, out)
		}
	}

	// The CRDs without a manager: helm uninstall leaves them.
	if err := own.InstallCRDs(ctx, "gpu.loom.dev"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"gpus"}, {"upgrades", "-o", "json"}} {
		out, _, err := runOn(t, kc, args...)
		if err == nil || !strings.Contains(err.Error(), "no Loom manager is installed") || !strings.Contains(err.Error(), "is Loom installed?") || out != "" {
			t.Errorf("%v with the CRDs and no manager: err %v; printed %q", args, err, out)
		}
	}
	if err := own.CreateNamespace(ctx, "loom-system"); err != nil {
		t.Fatal(err)
	}
	if err := own.Client.Create(ctx, loomWorkload(&appsv1.Deployment{}, "loom-system", "gpu", "manager", "gpu-loom-manager", "loom-manager")); err != nil {
		t.Fatal(err)
	}
	const none = "No GPU nodes found (no node has a GPUNode, the nvidia.com/gpu.present label or a GPU resource)\n"
	for _, tc := range []struct {
		args           []string
		stdout, stderr string
	}{
		{[]string{"gpus"}, "", none},
		{[]string{"gpus", "-o", "wide"}, "", none},
		{[]string{"gpus", "-o", "json"}, "[]\n", ""},
		{[]string{"upgrades"}, "no ClusterPolicy in force: Loom upgrades no driver\n", none},
		{[]string{"upgrades", "-o", "json"}, "{\n    \"policies\": [],\n    \"nodes\": []\n}\n", ""},
	} {
		out, errOut, err := runOn(t, kc, tc.args...)
		if err != nil || out != tc.stdout || errOut != tc.stderr {
			t.Errorf("%v without GPU nodes: err %v\nstdout %q, want %q\nstderr %q, want %q", tc.args, err, out, tc.stdout, errOut, tc.stderr)
		}
	}
}
