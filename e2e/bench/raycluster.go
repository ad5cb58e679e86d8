package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/loom-dev/loom/e2e/framework"
)

// RayConfig sizes the raycluster scenario, measured the way KubeRay v1.5.0
// was measured: Clusters RayClusters of 1 head + 3 workers on as
// many nodes, the time from creating them to all ready, the manager's peak
// and settled RSS (VmHWM/VmRSS of its process) and its API requests, then
// an Idle window.
type RayConfig struct {
	Clusters int
	Idle     time.Duration
}

// RayReport is what the raycluster scenario measured.
type RayReport struct {
	Config             RayConfig
	PodsCreated, Ready time.Duration
	// ControlPlaneCPU is kube-apiserver's and etcd's CPU seconds from the
	// first create to all ready.
	ControlPlaneCPU                float64
	RSSBefore, RSSPeak, RSSSettled int64
	Busy, Idle                     map[framework.APIRequest]float64
}

// RunRayClusters runs the raycluster scenario on env, with only the
// raycluster controller.
func RunRayClusters(ctx context.Context, env *Env, cfg RayConfig) (*RayReport, error) {
	c, ns := env.Cluster, "bench"
	if _, err := c.CreateNodes(ctx, framework.NodeSpec{Prefix: "node", Count: cfg.Clusters}); err != nil {
		return nil, err
	}
	env.Logf("%d nodes Ready", cfg.Clusters)
	rel, err := env.Install(ctx, "nodeAgent.enabled=false")
	if err != nil {
		return nil, err
	}
	m, err := env.StartManager(ctx, rel, "--controllers=raycluster", "--gang-scheduler=none")
	if err != nil {
		return nil, err
	}
	defer m.Stop(20 * time.Second)
	if err := createNamespace(ctx, c, ns); err != nil {
		return nil, err
	}
	r := &RayReport{Config: cfg, RSSBefore: m.Ready.RSS}
	if err := r.waitReady(ctx, env, ns); err != nil {
		return nil, err
	}
	settle()
	busy, after, err := m.busyThenIdle(cfg.Idle)
	if err != nil {
		return nil, err
	}
	r.RSSPeak, r.RSSSettled = busy.PeakRSS, after.RSS
	r.Busy, r.Idle = busy.Since(m.Ready), after.Since(busy)
	return r, nil
}

// waitReady creates the RayClusters and times them to all pods created and
// to all ready.
func (r *RayReport) waitReady(ctx context.Context, env *Env, ns string) error {
	c, n := env.Cluster, r.Config.Clusters
	obs, err := env.observe(ctx, ns)
	if err != nil {
		return err
	}
	defer obs.close()
	if _, err := obs.readyRayClusters(ctx); err != nil { // its informer starts before the clock
		return err
	}
	if _, _, err := obs.pods(ctx); err != nil {
		return err
	}
	start, cp0 := time.Now(), controlPlaneCPU(c)
	if err := createRayClusters(ctx, c, ns, n); err != nil {
		return err
	}
	env.Logf("%d RayClusters created (by this program) after %s", n, round(time.Since(start)))
	err = poll(ctx, c, 250*time.Millisecond, 15*time.Minute, func() (bool, string, error) {
		if r.PodsCreated == 0 {
			pods, _, err := obs.pods(ctx)
			if err != nil {
				return false, "", err
			}
			if pods >= 4*n {
				r.PodsCreated = time.Since(start)
				env.Logf("all %d pods created after %s", 4*n, round(r.PodsCreated))
			}
		}
		ready, err := obs.readyRayClusters(ctx)
		return ready == n, fmt.Sprintf("%d of %d ready", ready, n), err
	})
	r.Ready, r.ControlPlaneCPU = time.Since(start), controlPlaneCPU(c)-cp0
	if err == nil {
		env.Logf("%d RayClusters ready after %s", n, round(r.Ready))
	}
	return err
}

// Print writes the report as one table.
func (r *RayReport) Print(w io.Writer) error {
	t := NewTable(w)
	n := r.Config.Clusters
	t.Row("RayClusters (1 head + 3 workers)", "%d (%d pods) on %d nodes", n, 4*n, n)
	t.Row("create -> all pods created", "%s", round(r.PodsCreated))
	t.Row("create -> all ready", "%s", round(r.Ready))
	t.Row("API server + etcd CPU, create -> all ready", "%.2f s", r.ControlPlaneCPU)
	t.Row("manager RSS before / peak / settled", "%s / %s / %s", mib(r.RSSBefore), mib(r.RSSPeak), mib(r.RSSSettled))
	t.Row("KubeRay v1.5.0, same machine type (published)", "100 clusters: 9 s, RSS 68 MiB, 1,232 writes")
	t.Requests(Column{Name: "busy", Counts: r.Busy}, Column{Name: fmt.Sprintf("idle %s", r.Config.Idle), Counts: r.Idle})
	return t.Flush()
}
