package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// A Ready GPU stack on 50 GPU nodes costs no API writes over a minute,
// apart from the leader-election lease.
func TestIdleFleetOfFiftyGPUNodesWritesNothing(t *testing.T) {
	ctx := context.Background()
	if _, err := cluster.CreateNodes(ctx, framework.NodeSpec{Prefix: "idle-gpu", Count: 50, GPUs: 8,
		Labels: map[string]string{"nvidia.com/gpu.present": "true"}}); err != nil {
		t.Fatal(err)
	}
	_, mgr := startLoomManager(t)
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "idle-stack"}}
	createPolicy(t, cp)
	eventually(t, 180*time.Second, func() (bool, string) {
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			return false, err.Error()
		}
		return cp.Status.State == gpuv1alpha1.PolicyReady && cp.Status.GPUNodes >= 50, fmt.Sprintf("state %s on %d GPU nodes", cp.Status.State, cp.Status.GPUNodes)
	})
	time.Sleep(3 * time.Second) // the rollout's last coalesced status write
	before := managerRequests(t, mgr)
	const idle = 60 * time.Second
	time.Sleep(idle)
	after := managerRequests(t, mgr)
	var leases, reads float64
	for k, v := range after {
		d := v - before[k]
		switch {
		case d == 0:
		case k.Resource == "leases":
			leases += d
		case k.Resource == "tokenreviews" || k.Resource == "subjectaccessreviews":
			// The metrics endpoint authenticating this test's own scrape.
		case k.Verb == "get" || k.Verb == "list" || k.Verb == "watch":
			reads += d
		default:
			t.Errorf("idle write: %s %s ×%v", k.Verb, k.Resource, d)
		}
	}
	t.Logf("idle %s, policy Ready on %d GPU nodes: %v lease requests, %v other reads, no other writes", idle, cp.Status.GPUNodes, leases, reads)
}
