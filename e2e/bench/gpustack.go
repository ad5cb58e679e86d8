package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// GPUStackConfig sizes the gpu-stack scenario: a default ClusterPolicy on
// Nodes GPU nodes (and 2 CPU nodes), the time from apply to Ready, and the
// manager's API requests during the rollout and an Idle window after it.
type GPUStackConfig struct {
	Nodes int
	Idle  time.Duration
}

// GPUStackReport is what the gpu-stack scenario measured.
type GPUStackReport struct {
	Config        GPUStackConfig
	Ready         time.Duration
	Rollout, Idle map[framework.APIRequest]float64
}

// RunGPUStack runs the gpu-stack scenario on env.
func RunGPUStack(ctx context.Context, env *Env, cfg GPUStackConfig) (*GPUStackReport, error) {
	c := env.Cluster
	// The nodes carry nvidia.com/gpu.present themselves (as GFD or an earlier
	// Loom would have set it): this measures the GPU stack, not the agents.
	if _, err := c.CreateNodes(ctx, framework.NodeSpec{Prefix: "gpu", Count: cfg.Nodes, GPUs: 8,
		Labels: map[string]string{"nvidia.com/gpu.present": "true"}}); err != nil {
		return nil, err
	}
	if _, err := c.CreateNodes(ctx, framework.NodeSpec{Prefix: "cpu", Count: 2}); err != nil {
		return nil, err
	}
	env.Logf("%d GPU nodes Ready", cfg.Nodes)
	rel, err := env.Install(ctx, "nodeAgent.enabled=false")
	if err != nil {
		return nil, err
	}
	m, err := env.StartManager(ctx, rel)
	if err != nil {
		return nil, err
	}
	defer m.Stop(20 * time.Second)
	r := &GPUStackReport{Config: cfg}
	cp := &gpuv1alpha1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if r.Ready, err = applyPolicy(ctx, c, cp, 0, 15*time.Minute); err != nil {
		return nil, err
	}
	env.Logf("ClusterPolicy Ready after %s", round(r.Ready))
	busy, after, err := m.busyThenIdle(cfg.Idle)
	if err != nil {
		return nil, err
	}
	r.Rollout, r.Idle = busy.Since(m.Ready), after.Since(busy)
	return r, nil
}

// Print writes the report as one table.
func (r *GPUStackReport) Print(w io.Writer) error {
	t := NewTable(w)
	t.Row("GPU nodes", "%d", r.Config.Nodes)
	t.Row("ClusterPolicy apply -> Ready", "%s", round(r.Ready))
	t.Row("operand pods", "%d", 6*r.Config.Nodes)
	t.Requests(Column{Name: "apply -> Ready", Counts: r.Rollout}, Column{Name: fmt.Sprintf("idle %s", r.Config.Idle), Counts: r.Idle})
	return t.Flush()
}
