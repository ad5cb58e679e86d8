package nodelabels

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/testenv"
)

// nvidia.com/gpu.deploy.driver=pre-installed: set on a node whose driver is
// the host's (NVML up), unlabelled, with no ready driver pod of Loom's;
// Loom's own kept until the driver is a container's; anyone else's value
// never touched.
func TestDesiredPreInstalled(t *testing.T) {
	withDriver := func(st gpuv1alpha1.GPUNodeStatus, src gpuv1alpha1.DriverSource) *gpuv1alpha1.GPUNodeStatus {
		st = *st.DeepCopy()
		if src != "" {
			st.Driver = &gpuv1alpha1.GPUDriver{Source: src}
		}
		return &st
	}
	h100 := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(2)})
	host, container, unknown := withDriver(h100, gpuv1alpha1.DriverHost), withDriver(h100, gpuv1alpha1.DriverContainer), withDriver(h100, "")
	hostDown := withDriver(nvmlUnavailableStatus(h100), gpuv1alpha1.DriverHost)
	emptyDown := withDriver(nvmlUnavailableStatus(gpuv1alpha1.GPUNodeStatus{}), gpuv1alpha1.DriverHost)
	const k, pre = gpuv1alpha1.LabelDeployDriver, gpuv1alpha1.DeployDriverPreInstalled
	ours := []string{k, gpuv1alpha1.LabelPresent}
	tests := []struct {
		name string
		in   Input
		host bool   // HostDriver: the pods are to be read
		want string // the label's desired value; "" absent
	}{
		{"host driver, no driver pod", Input{GPUNode: host}, true, pre},
		{"host driver, Loom's driver pod not ready", Input{GPUNode: host, LoomDriverReady: false}, true, pre},
		{"host driver, Loom's driver pod ready", Input{GPUNode: host, LoomDriverReady: true}, true, ""},
		{"container driver", Input{GPUNode: container}, false, ""},
		{"source unknown", Input{GPUNode: unknown}, false, ""},
		{"no GPUNode", Input{}, false, ""},
		{"host driver, NVML unavailable", Input{GPUNode: hostDown}, false, ""},
		{"a person's false", Input{GPUNode: host, NodeLabels: map[string]string{k: "false"}}, false, ""},
		{"a person's true", Input{GPUNode: host, NodeLabels: map[string]string{k: "true"}}, false, ""},
		{"a person's pre-installed", Input{GPUNode: host, NodeLabels: map[string]string{k: pre}}, false, ""},
		{"Loom's, host driver", Input{GPUNode: host, NodeLabels: map[string]string{k: pre}, Managed: ours}, false, pre},
		{"Loom's, NVML unavailable", Input{GPUNode: hostDown, NodeLabels: map[string]string{k: pre}, Managed: ours}, false, pre},
		{"Loom's, NVML unavailable, no GPUs kept", Input{GPUNode: emptyDown, NodeLabels: map[string]string{k: pre}, Managed: ours}, false, pre},
		{"Loom's, GPUNode gone", Input{NodeLabels: map[string]string{k: pre}, Managed: ours}, false, pre},
		{"Loom's, source unknown", Input{GPUNode: unknown, NodeLabels: map[string]string{k: pre}, Managed: ours}, false, pre},
		{"Loom's, container driver", Input{GPUNode: container, NodeLabels: map[string]string{k: pre}, Managed: ours}, false, ""},
		{"Loom's, changed by a person", Input{GPUNode: host, NodeLabels: map[string]string{k: "true"}, Managed: ours}, false, ""},
		{"Loom's, removed by a person", Input{GPUNode: host, Managed: ours}, true, pre},
		{"Loom's, removed by a person, NVML unavailable", Input{GPUNode: emptyDown, Managed: ours}, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := HostDriver(tt.in); got != tt.host {
				t.Errorf("HostDriver = %v, want %v", got, tt.host)
			}
			got, set := Desired(tt.in)[k]
			if got != tt.want || set != (tt.want != "") {
				t.Errorf("%s = %q (set %v), want %q", k, got, set, tt.want)
			}
		})
	}
}

// loomDriverPod creates a driver pod of Loom's on node, ready or not.
func loomDriverPod(t *testing.T, node string, ready bool) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	// Controlled by a DaemonSet, as a real one: the manager's pod cache
	// keeps the labels and readiness of its operand DaemonSets' pods only.
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "loom-driver-" + node, Namespace: "loom-system",
		Labels: map[string]string{apply.LabelManagedBy: apply.ManagedBy, gpuv1alpha1.LabelComponent: gpuv1alpha1.OperandDriver},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "loom-driver", UID: "0b1c6e3e-driver",
			Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "driver", Image: "driver"}}}}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	setPodReady(t, p, ready)
	return p
}

func setPodReady(t *testing.T, p *corev1.Pod, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
		return env.Client.Status().Update(context.Background(), p)
	})
}

// stays checks, after the labeller had time to act, that the node's
// nvidia.com/gpu.deploy.driver is want ("": absent).
func stays(t *testing.T, node, want string) {
	t.Helper()
	time.Sleep(2 * time.Second)
	l, _ := nodeLabels(t, node)
	if got, ok := l[gpuv1alpha1.LabelDeployDriver]; got != want || ok != (want != "") {
		t.Fatalf("%s: %s = %q (set %v), want %q (labels %v)", node, gpuv1alpha1.LabelDeployDriver, got, ok, want, l)
	}
}

// On a real API server: a node whose agent reads the GPUs through the
// host's driver is labelled pre-installed, not while a driver pod of
// Loom's is ready there; the label stays while NVML is unavailable and
// goes once the driver is a container's; a person's value is never
// touched.
func TestLabellerPreInstalledDriver(t *testing.T) {
	deletePolicies(t)
	startManager(t)
	const k, pre = gpuv1alpha1.LabelDeployDriver, gpuv1alpha1.DeployDriverPreInstalled
	st := collected(t, collect.SimOptions{System: "dgx-h100", GPUs: intPtr(2)})
	host := *st.DeepCopy()
	host.Driver = &gpuv1alpha1.GPUDriver{Source: gpuv1alpha1.DriverHost}

	createNode(t, "preinst-host", nil)
	pod := loomDriverPod(t, "preinst-host", true)
	setStatus(t, "preinst-host", host)
	wantLabels(t, "preinst-host", map[string]string{gpuv1alpha1.LabelDriverFull: "550.54.15"})
	stays(t, "preinst-host", "") // Loom's driver is ready there

	// Loom's driver pod is no longer ready (the host's driver holds the
	// GPUs): the node is labelled at once, with no GPUNode or Node change.
	setPodReady(t, pod, false)
	wantLabels(t, "preinst-host", map[string]string{k: pre})

	// NVML unavailable: the label stays.
	setStatus(t, "preinst-host", nvmlUnavailableStatus(host))
	stays(t, "preinst-host", pre)

	// The driver is a container's: Loom's label goes.
	container := *st.DeepCopy()
	container.Driver = &gpuv1alpha1.GPUDriver{Source: gpuv1alpha1.DriverContainer}
	setStatus(t, "preinst-host", container)
	wantLabels(t, "preinst-host", map[string]string{gpuv1alpha1.LabelPresent: "true"}, k)

	// Loom's ready driver pod deleted: labelled at once too.
	createNode(t, "preinst-deleted", nil)
	pod = loomDriverPod(t, "preinst-deleted", true)
	setStatus(t, "preinst-deleted", host)
	wantLabels(t, "preinst-deleted", map[string]string{gpuv1alpha1.LabelDriverFull: "550.54.15"})
	stays(t, "preinst-deleted", "")
	if err := env.Client.Delete(context.Background(), pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	wantLabels(t, "preinst-deleted", map[string]string{k: pre})

	// A person's value stays, whatever the driver.
	createNode(t, "preinst-person", map[string]string{k: "true"})
	setStatus(t, "preinst-person", host)
	wantLabels(t, "preinst-person", map[string]string{gpuv1alpha1.LabelDriverFull: "550.54.15"})
	stays(t, "preinst-person", "true")
}
