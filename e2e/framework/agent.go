package framework

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AgentSpec is a simulated node agent.
type AgentSpec struct {
	// Node the agent's token is bound to (through the chart's DaemonSet pod
	// that kwok runs there).
	Node string
	// NodeName the agent reports for (default Node); set it differently to
	// see the admission policy refuse.
	NodeName string
	// System is the simulated system (dgx-a100, dgx-h100, dgx-h200, dgx-b200).
	System string
	GPUs   *int
	MIG    string
	// Bare simulates a node without a loaded driver (--simulate-bare): NVML
	// fails with ERROR_LIBRARY_NOT_FOUND until
	// DriverRoot/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 exists (see
	// collect.BareLibrary), and every call fails with
	// ERROR_DRIVER_NOT_LOADED once it is removed again.
	Bare bool
	// HostDriver simulates a driver installed on the host
	// (--simulate-host-driver): NVML works from the start and the GPUNode
	// says its driver source is Host.
	HostDriver bool
	// DriverRoot is --driver-root (required with Bare).
	DriverRoot string
	// MIGFile is --simulate-mig-file: the simulated MIG manager's layout,
	// read before each collection (see collect.Simulator.ReloadMIG).
	MIGFile string
	// SysfsRoot is --sysfs-root; empty: the agent fabricates a PCI bus of
	// the simulated GPUs in a temporary directory.
	SysfsRoot string
	Args      []string
}

// RunAgent starts `loom-node-agent --simulate` (the one beside loomBin) as
// a local process with a token bound to the release's node-agent DaemonSet
// pod on spec.Node, so the agent authenticates exactly as it would in that
// pod: the chart's RBAC and admission policy apply.
func (c *Cluster) RunAgent(ctx context.Context, loomBin string, rel *Release, spec AgentSpec) (*Process, error) {
	pod, err := c.WaitDaemonPod(ctx, rel.Namespace, "app.kubernetes.io/component=node-agent", spec.Node, 90*time.Second)
	if err != nil {
		return nil, err
	}
	tr, err := c.Clientset.CoreV1().ServiceAccounts(rel.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](24 * 3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
		}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token bound to pod %s: %w", pod.Name, err)
	}
	name := "node-agent-" + spec.Node
	kubeconfig := filepath.Join(c.Dir, name+".kubeconfig")
	if err := WriteKubeconfig(kubeconfig, c.Server, c.CAFile, tr.Status.Token, "node-agent"); err != nil {
		return nil, err
	}
	nodeName := spec.NodeName
	if nodeName == "" {
		nodeName = spec.Node
	}
	args := []string{"--node-name=" + nodeName, "--simulate=" + spec.System,
		"--metrics-bind-address=0", "--log-format=text"}
	if spec.GPUs != nil {
		args = append(args, "--simulate-gpus="+strconv.Itoa(*spec.GPUs))
	}
	if spec.MIG != "" {
		args = append(args, "--simulate-mig="+spec.MIG)
	}
	if spec.Bare {
		args = append(args, "--simulate-bare")
	}
	if spec.HostDriver {
		args = append(args, "--simulate-host-driver")
	}
	for _, f := range [][2]string{{"--driver-root", spec.DriverRoot}, {"--simulate-mig-file", spec.MIGFile}, {"--sysfs-root", spec.SysfsRoot}} {
		if f[1] != "" {
			args = append(args, f[0]+"="+f[1])
		}
	}
	args = append(args, spec.Args...)
	return c.StartProcess(name, AgentBinary(loomBin), []string{"KUBECONFIG=" + kubeconfig}, args...)
}

// WaitDaemonPod waits for a running pod matching selector on node.
func (c *Cluster) WaitDaemonPod(ctx context.Context, ns, selector, node string, timeout time.Duration) (*corev1.Pod, error) {
	var found *corev1.Pod
	err := c.poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		sel, err := metav1.ParseToLabelSelector(selector)
		if err != nil {
			return false, err
		}
		ls, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			return false, err
		}
		if err := c.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: ls}); err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				found = p
				return true, nil
			}
		}
		return false, nil
	}, fmt.Sprintf("pod %s on node %s", selector, node))
	return found, err
}
