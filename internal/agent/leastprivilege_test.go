package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/collect"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

const agentNS = "loom-system"

// installAgentPolicy applies the chart's own node-agent objects: service
// account, ClusterRole and binding, ValidatingAdmissionPolicy and binding.
func installAgentPolicy(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := env.CreateNamespace(ctx, agentNS); err != nil {
		t.Fatal(err)
	}
	objs, err := testenv.RenderChart(agentNS)
	if err != nil {
		t.Fatal(err)
	}
	var keep []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/component"] == "node-agent" && o.GetKind() != "DaemonSet" {
			keep = append(keep, o)
		}
	}
	if len(keep) != 5 {
		t.Fatalf("chart rendered %d node-agent objects besides the DaemonSet, want 5", len(keep))
	}
	if err := testenv.Apply(ctx, env.Config, env.Client, keep); err != nil {
		t.Fatal(err)
	}
}

// agentClient returns a client authenticated as the chart's node-agent
// service account with a token bound to a pod on node.
func agentClient(t *testing.T, node string) client.WithWatch {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := client.IgnoreAlreadyExists(env.Client.Create(ctx, n)); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: agentNS, Name: "agent-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "loom-node-agent",
			Containers: []corev1.Container{{Name: "node-agent", Image: "loom"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(env.Config)
	tr, err := cs.CoreV1().ServiceAccounts(agentNS).CreateToken(ctx, "loom-node-agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAgentMayWriteOnlyItsOwnGPUNode(t *testing.T) {
	installAgentPolicy(t)
	ctx := context.Background()
	onA := agentClient(t, "lp-node-a")
	agentClient(t, "lp-node-b") // node B exists, with its own agent pod

	// The agent on node A publishes node A's inventory.
	s, err := collect.Simulate(collect.SimOptions{System: "dgx-h100", Seed: "lp-node-a"})
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{NodeName: "lp-node-a", Lib: s, Client: onA, Log: ctrl.Log, Interval: time.Hour, Metrics: NewMetrics()}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "lp-node-a", "8 GPUs published by its own agent", func(gn *gpuv1alpha1.GPUNode) bool { return gn.Status.GPUCount == 8 })

	// The same agent writing node B's GPUNode is denied, with a message
	// naming both nodes. (The policy takes a moment to become active.)
	var lastErr error
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(gpuv1alpha1.GroupVersion.String())
		u.SetKind("GPUNode")
		u.SetName("lp-node-b")
		lastErr = onA.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner))
		if apierrors.IsForbidden(lastErr) && strings.Contains(lastErr.Error(), "may write only GPUNode lp-node-a, not lp-node-b") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !apierrors.IsForbidden(lastErr) || !strings.Contains(lastErr.Error(), "the Loom node agent on node lp-node-a may write only GPUNode lp-node-a, not lp-node-b") {
		t.Fatalf("cross-node write: %v", lastErr)
	}
	t.Logf("denied as expected: %v", lastErr)

	// It may watch its GPUNode, as it does.
	w, err := onA.Watch(ctx, &gpuv1alpha1.GPUNodeList{}, client.MatchingFields{"metadata.name": "lp-node-a"})
	if err != nil {
		t.Errorf("agent watching its GPUNode: %v", err)
	} else {
		w.Stop()
	}
	// Nor can it read anything but GPUNodes.
	if err := onA.Get(ctx, client.ObjectKey{Name: "lp-node-a"}, &corev1.Node{}); !apierrors.IsForbidden(err) {
		t.Errorf("agent reading its Node: %v, want forbidden", err)
	}
	if err := onA.List(ctx, &corev1.PodList{}); !apierrors.IsForbidden(err) {
		t.Errorf("agent listing pods: %v, want forbidden", err)
	}
}
