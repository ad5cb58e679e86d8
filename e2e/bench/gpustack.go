package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// GPUStackConfig sizes the gpu-stack scenario: a default ClusterPolicy on
// Nodes GPU nodes (and 2 CPU nodes), the time from apply to Ready, and the
// manager's API requests during the rollout and an Idle window after it.
type GPUStackConfig struct {
	Nodes int
	Idle  time.Duration
	// ForeignConfigMapsMiB of ConfigMaps that are not Loom's are created
	// once the stack is Ready: the manager's RSS before and after shows
	// that its cache holds only Loom's own.
	ForeignConfigMapsMiB int
}

// GPUStackReport is what the gpu-stack scenario measured.
type GPUStackReport struct {
	Config        GPUStackConfig
	Ready         time.Duration
	Rollout, Idle map[framework.APIRequest]float64
	// RSS before and after the foreign ConfigMaps, when there were any.
	RSSBefore, RSSAfter int64
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
	if cfg.ForeignConfigMapsMiB > 0 {
		if r.RSSBefore, r.RSSAfter, err = foreignConfigMaps(ctx, env, m, cfg.ForeignConfigMapsMiB); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// foreignConfigMaps creates mib MiB of ConfigMaps no controller owns, in
// 512 KiB objects, and returns the manager's RSS before and after (once the
// watch events would have reached a cache that held them).
func foreignConfigMaps(ctx context.Context, env *Env, m *Manager, mib int) (before, after int64, err error) {
	s, err := m.Snapshot()
	if err != nil {
		return 0, 0, err
	}
	before = s.RSS
	c := env.Cluster.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "foreign-configmaps"}}); client.IgnoreAlreadyExists(err) != nil {
		return 0, 0, err
	}
	data := strings.Repeat("x", 512<<10)
	for i := range 2 * mib {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "foreign-configmaps", Name: fmt.Sprintf("foreign-%d", i)},
			Data: map[string]string{"blob": data}}
		if err := c.Create(ctx, cm); client.IgnoreAlreadyExists(err) != nil {
			return 0, 0, err
		}
	}
	env.Logf("%d MiB of foreign ConfigMaps created", mib)
	settle()
	time.Sleep(10 * time.Second)
	if s, err = m.Snapshot(); err != nil {
		return 0, 0, err
	}
	return before, s.RSS, nil
}

// Print writes the report as one table.
func (r *GPUStackReport) Print(w io.Writer) error {
	t := NewTable(w)
	t.Row("GPU nodes", "%d", r.Config.Nodes)
	t.Row("ClusterPolicy apply -> Ready", "%s", round(r.Ready))
	t.Row("operand pods", "%d", 6*r.Config.Nodes)
	if r.Config.ForeignConfigMapsMiB > 0 {
		t.Row(fmt.Sprintf("manager RSS before / after %d MiB of foreign ConfigMaps", r.Config.ForeignConfigMapsMiB), "%s / %s", mib(r.RSSBefore), mib(r.RSSAfter))
	}
	t.Requests(Column{Name: "apply -> Ready", Counts: r.Rollout}, Column{Name: fmt.Sprintf("idle %s", r.Config.Idle), Counts: r.Idle})
	return t.Flush()
}
