package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// PendingConfig sizes the pending scenario: Jobs TrainingJobs of 1 pod × 8
// GPUs on Nodes 8-GPU nodes, so that Nodes of them run and the rest wait
// for GPUs; then a churn Window during which, every Every, the benchmark
// ends Finish running jobs (their pods succeed) and waiting ones take the
// GPUs they free. What it measures is Loom's API writes in the window: a
// waiting job's status must be written when its verdict changes, not
// whenever a GPU elsewhere is allocated or freed.
//
// Jobs of one size on nodes they fill leave nothing free once the
// scheduler has placed the next pod, so the free GPUs a waiting job sees
// hardly move. TenantNodes more 8-GPU nodes carry another tenant's 1-GPU
// pods (bound by name, never fewer than 1 nor more than 7 a node, so no
// job fits there), whose number the benchmark changes at every step: the
// free GPUs elsewhere that a waiting job's status must not follow.
type PendingConfig struct {
	Jobs, Nodes, Finish, TenantNodes int
	Window, Every                    time.Duration
}

// Check says whether the shape leaves jobs waiting and the churn has room.
func (cfg PendingConfig) Check() error {
	switch {
	case cfg.Nodes < 1 || cfg.Jobs <= cfg.Nodes:
		return fmt.Errorf("need 1 <= nodes < jobs: some jobs must wait")
	case cfg.Finish < 1 || cfg.Finish > cfg.Nodes:
		return fmt.Errorf("need 1 <= finish <= nodes")
	case cfg.Every <= 0 || cfg.Window < cfg.Every:
		return fmt.Errorf("need 0 < every <= window")
	case cfg.TenantNodes < 0:
		return fmt.Errorf("need tenant-nodes >= 0")
	}
	return nil
}

// PendingReport is what the pending scenario measured.
type PendingReport struct {
	Config PendingConfig
	// Settled is the time from the first job's creation to every job
	// having a status, Nodes of them running, and Loom's writes quiet.
	Settled time.Duration
	// Window is the churn window as measured (snapshot to snapshot).
	Window time.Duration
	// Before and After are the jobs at the window's ends.
	Before, After jobCounts
	// Requests are Loom's API requests in the window.
	Requests map[framework.APIRequest]float64
	// Status is the TrainingJob status writes Loom's writer decided in the
	// window, by result (written, coalesced, skipped).
	Status map[string]float64
	// PendingSeries counts loom_trainingjob_pending_gpus series at the
	// window's end (a build without the gauge: 0).
	PendingSeries int
}

// jobCounts are the benchmark's jobs by what matters here.
type jobCounts struct{ scheduled, succeeded, waiting int }

// started is how many jobs were scheduled since before.
func (n jobCounts) started(before jobCounts) int {
	return n.scheduled + n.succeeded - before.scheduled - before.succeeded
}

// RunPending runs the pending scenario on env, with only the trainingjob
// controller and no gang scheduler (the pods of waiting jobs exist and
// wait for the scheduler, as with a plain Job).
func RunPending(ctx context.Context, env *Env, cfg PendingConfig) (*PendingReport, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	c, ns := env.Cluster, "bench"
	if _, err := c.CreateNodes(ctx, framework.NodeSpec{Prefix: "gpu", Count: cfg.Nodes, GPUs: 8}); err != nil {
		return nil, err
	}
	tenant, err := startTenant(ctx, c, cfg.TenantNodes)
	if err != nil {
		return nil, err
	}
	env.Logf("%d nodes Ready (and %d of another tenant's)", cfg.Nodes, cfg.TenantNodes)
	rel, err := env.Install(ctx, "nodeAgent.enabled=false")
	if err != nil {
		return nil, err
	}
	m, err := env.StartManager(ctx, rel, "--controllers=trainingjob", "--gang-scheduler=none")
	if err != nil {
		return nil, err
	}
	defer m.Stop(20 * time.Second)
	if err := createNamespace(ctx, c, ns); err != nil {
		return nil, err
	}
	r := &PendingReport{Config: cfg}
	start := time.Now()
	if err := parallel(cfg.Jobs, func(i int) error {
		return c.Client.Create(ctx, trainingJob(ns, fmt.Sprintf("p-%04d", i), 0, "8"))
	}); err != nil {
		return nil, err
	}
	env.Logf("%d TrainingJobs created after %s", cfg.Jobs, round(time.Since(start)))
	if err := r.waitSettled(ctx, env, m, ns); err != nil {
		return nil, err
	}
	r.Settled = time.Since(start)
	env.Logf("settled after %s: %d running, %d waiting", round(r.Settled), r.Before.scheduled, r.Before.waiting)
	return r, r.churn(ctx, env, m, ns, tenant)
}

// waitSettled waits until every job has a status, Nodes jobs are
// scheduled and Loom's writes have been quiet for a while, so that the
// window measures the churn, not the jobs' first statuses.
func (r *PendingReport) waitSettled(ctx context.Context, env *Env, m *Manager, ns string) error {
	c := env.Cluster
	if err := poll(ctx, c, time.Second, 15*time.Minute, func() (bool, string, error) {
		n, err := countJobs(ctx, c, ns)
		done := n.scheduled == r.Config.Nodes && n.scheduled+n.waiting == r.Config.Jobs
		return done, fmt.Sprintf("%d scheduled, %d waiting with a status, of %d", n.scheduled, n.waiting, r.Config.Jobs), err
	}); err != nil {
		return err
	}
	// Then no write for 6 s (after 5 minutes of writes the churn starts
	// anyway, and its window shows them).
	if _, _, err := (quietness{quiet: 6 * time.Second, limit: 5 * time.Minute, every: 2 * time.Second}).converge(env.Logf, loomContender{m}); err != nil {
		return err
	}
	n, err := countJobs(ctx, c, ns)
	r.Before = n
	return err
}

// churn ends Finish running jobs every Every for the window, and measures
// Loom's requests from the window's start to its end.
func (r *PendingReport) churn(ctx context.Context, env *Env, m *Manager, ns string, tenant *tenant) error {
	c := env.Cluster
	s0, err := m.Snapshot()
	if err != nil {
		return err
	}
	status0 := statusWrites(m.Scrape())
	t0 := time.Now()
	tick := time.NewTicker(r.Config.Every)
	defer tick.Stop()
	ended := 0
	for time.Since(t0)+r.Config.Every <= r.Config.Window {
		n, err := endRunning(ctx, c, ns, r.Config.Finish)
		if err != nil {
			return err
		}
		ended += n
		if err := tenant.step(ctx); err != nil {
			return err
		}
		if err := c.Check(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	if rest := r.Config.Window - time.Since(t0); rest > 0 {
		time.Sleep(rest)
	}
	s1, err := m.Snapshot()
	if err != nil {
		return err
	}
	r.Window = time.Since(t0)
	text := m.Scrape()
	r.Requests, r.Status = s1.Since(s0), diffNamed(statusWrites(text), status0)
	r.PendingSeries = strings.Count(text, "\nloom_trainingjob_pending_gpus{")
	if r.After, err = countJobs(ctx, c, ns); err != nil {
		return err
	}
	env.Logf("window %s: %d pods ended, %d jobs succeeded, %d started, %d waiting", round(r.Window), ended,
		r.After.succeeded-r.Before.succeeded, r.After.started(r.Before), r.After.waiting)
	return nil
}

// endRunning ends up to n running pods, those running the longest first:
// the kwok stage loom-sim-exit (sim-stages.yaml) makes a running pod with
// sim.loom.dev/exit-code succeed a second later, as a finished training
// would, and Loom sees its job succeed.
func endRunning(ctx context.Context, c *framework.Cluster, ns string, n int) (int, error) {
	var list corev1.PodList
	if err := c.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return 0, err
	}
	var running []*corev1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		if _, ending := p.Annotations["sim.loom.dev/exit-code"]; p.Status.Phase == corev1.PodRunning && !ending && p.DeletionTimestamp == nil {
			running = append(running, p)
		}
	}
	sort.Slice(running, func(i, j int) bool { return startOf(running[i]).Before(startOf(running[j])) })
	ended := 0
	for _, p := range running[:min(n, len(running))] {
		patch := client.MergeFrom(p.DeepCopy())
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations["sim.loom.dev/exit-code"] = "0"
		if err := c.Client.Patch(ctx, p, patch); client.IgnoreNotFound(err) != nil {
			return ended, err
		}
		ended++
	}
	return ended, nil
}

// tenant is another tenant's 1-GPU pods on its own nodes, bound by name.
type tenant struct {
	c     *framework.Cluster
	nodes []string
	steps int
}

const tenantNS = "tenant"

// startTenant creates n tenant nodes with one tenant pod each, before any
// job exists: a tenant node is never free enough for a job.
func startTenant(ctx context.Context, c *framework.Cluster, n int) (*tenant, error) {
	t := &tenant{c: c}
	if n == 0 {
		return t, nil
	}
	var err error
	if t.nodes, err = c.CreateNodes(ctx, framework.NodeSpec{Prefix: "tenant", Count: n, GPUs: 8}); err != nil {
		return nil, err
	}
	if err := createNamespace(ctx, c, tenantNS); err != nil {
		return nil, err
	}
	return t, t.scale(ctx, 1)
}

// step moves every tenant node to its next count of busy GPUs: 1, 4, 7,
// 3, 6, 2, 5, 1, … (never 0 nor 8, always a change).
func (t *tenant) step(ctx context.Context) error {
	t.steps++
	return t.scale(ctx, 1+(3*t.steps)%7)
}

// scale makes each tenant node hold busy 1-GPU tenant pods.
func (t *tenant) scale(ctx context.Context, busy int) error {
	for _, node := range t.nodes {
		for i := range 7 {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: tenantNS, Name: fmt.Sprintf("%s-%d", node, i)},
				Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "notebook", Image: "jupyter/base-notebook",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{framework.GPUResource: framework.Quantity(1)}}}}}}
			var err error
			if i < busy {
				err = client.IgnoreAlreadyExists(t.c.Client.Create(ctx, p))
			} else {
				err = client.IgnoreNotFound(t.c.Client.Delete(ctx, p, client.GracePeriodSeconds(0)))
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func startOf(p *corev1.Pod) time.Time {
	if p.Status.StartTime != nil {
		return p.Status.StartTime.Time
	}
	return p.CreationTimestamp.Time
}

// countJobs counts the namespace's jobs: scheduled (Scheduled=True and not
// finished), succeeded, and waiting (a status, not scheduled, not finished).
func countJobs(ctx context.Context, c *framework.Cluster, ns string) (jobCounts, error) {
	var list trainingv1alpha1.TrainingJobList
	var n jobCounts
	if err := c.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return n, err
	}
	for i := range list.Items {
		st := &list.Items[i].Status
		sc := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionScheduled)
		switch {
		case st.State == trainingv1alpha1.StateSucceeded:
			n.succeeded++
		case st.Finished() || sc == nil:
		case sc.Status == "True":
			n.scheduled++
		default:
			n.waiting++
		}
	}
	return n, nil
}

// statusWrites reads loom_writes_total's TrainingJob status decisions by
// result from a scrape.
func statusWrites(text string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, "loom_writes_total{")
		if !ok || !strings.Contains(rest, `kind="TrainingJob"`) || !strings.Contains(rest, `operation="status"`) {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		_, result, _ := strings.Cut(labels, `result="`)
		result, _, _ = strings.Cut(result, `"`)
		v, _ := strconv.ParseFloat(strings.TrimSpace(value), 64)
		out[result] += v
	}
	return out
}

func diffNamed(after, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		out[k] = v - before[k]
	}
	return out
}

// Print writes the report as one table.
func (r *PendingReport) Print(w io.Writer) error {
	t := NewTable(w)
	cfg := r.Config
	t.Row("TrainingJobs (1 pod × 8 GPUs)", "%d on %d 8-GPU nodes: %d run, %d wait", cfg.Jobs, cfg.Nodes, r.Before.scheduled, r.Before.waiting)
	t.Row("churn", "every %s the benchmark ends %d running jobs, for %s", cfg.Every, cfg.Finish, round(r.Window))
	if cfg.TenantNodes > 0 {
		t.Row("another tenant", "%d 8-GPU nodes, 1-7 busy GPUs each, a new count every %s", cfg.TenantNodes, cfg.Every)
	}
	t.Row("create -> settled", "%s (every job with a status, %d running, writes quiet)", round(r.Settled), r.Before.scheduled)
	finished, started := r.After.succeeded-r.Before.succeeded, r.After.started(r.Before)
	t.Row("in the window", "%d jobs finished, %d started; waiting %d -> %d", finished, started, r.Before.waiting, r.After.waiting)
	perMin := writes(r.Requests) / r.Window.Minutes()
	statusWritten := writesOn(r.Requests, "trainingjobs/status")
	t.Row("writes without the lease", "%.1f/min, %.3f/min per waiting job", perMin, perMin/(float64(r.Before.waiting+r.After.waiting)/2))
	t.Row("TrainingJob status writes", "%.0f (%.1f per job started or finished)", statusWritten, statusWritten/float64(max(finished+started, 1)))
	t.Row("status passes not written", "%.0f unchanged, %.0f coalesced", r.Status["skipped"], r.Status["coalesced"])
	t.Row("loom_trainingjob_pending_gpus", "%d series at the end", r.PendingSeries)
	t.Requests(Column{Name: "per minute in the window", Counts: r.Requests, PerMinuteOf: r.Window}, Column{Name: "in the window", Counts: r.Requests})
	return t.Flush()
}

// writesOn counts the writes on one resource.
func writesOn(m map[framework.APIRequest]float64, resource string) (n float64) {
	for k, v := range m {
		if isWrite(k) && k.Resource == resource {
			n += v
		}
	}
	return n
}
