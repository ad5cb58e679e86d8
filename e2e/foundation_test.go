package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/e2e/framework"
)

// The simulated cluster schedules by GPU capacity the way a real one does.
func TestSimulatedGPUNodesSchedule(t *testing.T) {
	ctx := context.Background()
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "sched-h100", Count: 2, GPUs: 8, Product: "NVIDIA-H100-80GB-HBM3"}); err != nil {
		t.Fatal(err)
	}
	fits := gpuPod("default", "fits", 8)
	tooBig := gpuPod("default", "too-big", 16)
	for _, p := range []*corev1.Pod{fits, tooBig} {
		if err := cluster.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cluster.Client.Delete(context.Background(), p) })
	}
	eventually(t, 60*time.Second, func() (bool, string) {
		p := &corev1.Pod{}
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(fits), p); err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, "8-GPU pod phase " + string(p.Status.Phase)
	})
	// The scheduler has looked at the 16-GPU pod and found no node for it.
	eventually(t, 60*time.Second, func() (bool, string) {
		p := &corev1.Pod{}
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(tooBig), p); err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("16-GPU pod was placed on %s; no node has 16 GPUs", p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return strings.Contains(c.Message, "nvidia.com/gpu"), "unschedulable for another reason: " + c.Message
			}
		}
		return false, "16-GPU pod not yet marked unschedulable"
	})
}

// The chart installs, and the manager runs under the chart's service account
// (so the chart's RBAC is what is tested), becomes ready, leads, serves
// metrics, and releases its lease on SIGTERM.
func TestChartInstallsAndManagerRunsUnderItsServiceAccount(t *testing.T) {
	ctx := context.Background()
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "chart-cpu", Count: 2}); err != nil {
		t.Fatal(err)
	}
	const ns = "loom-system"
	rel, err := cluster.InstallChart(ctx, "loom", ns)
	if err != nil {
		t.Fatal(err)
	}
	dep := &metav1.PartialObjectMetadata{}
	dep.SetGroupVersionKind(schemaGVK("apps", "v1", "Deployment"))
	if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "loom-manager"}, dep); err != nil {
		t.Fatalf("chart's manager Deployment: %v", err)
	}

	m, err := cluster.RunManager(ctx, loomBin, rel, "--log-level=debug")
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitReady(ctx, m, ns, "loom-manager", 90*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("manager ready and leading %s after start", time.Since(m.StartedAt).Round(time.Millisecond))

	host, _ := os.Hostname()
	lease := &coordinationv1.Lease{}
	if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "loom-manager"}, lease); err != nil {
		t.Fatal(err)
	}
	if holder := ptr.Deref(lease.Spec.HolderIdentity, ""); !strings.HasPrefix(holder, host+"_") {
		t.Fatalf("lease held by %q, not by the local manager (%s_...)", holder, host)
	}
	if log := m.Tail(1 << 20); strings.Contains(log, "forbidden") {
		t.Fatalf("manager hit RBAC denials under the chart's service account:\n%s", log)
	}

	// Metrics are served over HTTPS and need a token.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {adminToken(t), http.StatusOK}} {
		eventually(t, 20*time.Second, func() (bool, string) {
			req, _ := http.NewRequest(http.MethodGet, m.MetricsURL, nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := hc.Do(req)
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == tc.want, fmt.Sprintf("/metrics answered %d, want %d", resp.StatusCode, tc.want)
		})
	}

	// SIGTERM: the manager exits cleanly and gives the lease up at once.
	if err := syscall.Kill(m.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, 40*time.Second, func() (bool, string) {
		exited, err := m.Exited()
		if exited && err != nil {
			t.Fatalf("manager exited with %v:\n%s", err, m.Tail(4000))
		}
		return exited, "manager still running after SIGTERM"
	})
	m.Stop(time.Second) // already gone: records that its exit was expected
	if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "loom-manager"}, lease); err != nil {
		t.Fatal(err)
	}
	if holder := ptr.Deref(lease.Spec.HolderIdentity, ""); holder != "" {
		t.Fatalf("lease still held by %q after a graceful stop", holder)
	}
}

func adminToken(t *testing.T) string {
	t.Helper()
	if cluster.Config.BearerToken == "" {
		t.Fatal("admin kubeconfig has no token")
	}
	return cluster.Config.BearerToken
}

func gpuPod(ns, name string, gpus int64) *corev1.Pod {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "cuda", Image: "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{framework.GPUResource: q}},
			}},
		},
	}
}

func eventually(t *testing.T, timeout time.Duration, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := f()
		if ok {
			return
		}
		if err := cluster.Check(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
