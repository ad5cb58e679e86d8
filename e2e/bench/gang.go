package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
	"github.com/loom-dev/loom/e2e/framework"
)

// GangConfig sizes the gang scenario: how fast the training reconciler
// creates a large gang, a TrainingJob of 1 master and Pods-1 workers (1 GPU
// each) on Nodes 8-GPU nodes, once with the manager's default client rate
// limits and once with client-go's (QPS 20, burst 30) in the same run, from
// the job's creation to every pod created, to every pod running, and the
// manager's API requests for each.
type GangConfig struct {
	Pods, Nodes int
}

// Check says whether the gang fits on the nodes.
func (cfg GangConfig) Check() error {
	if cfg.Pods < 2 || cfg.Nodes*8 < cfg.Pods {
		return fmt.Errorf("need 2 <= pods <= 8 × nodes")
	}
	return nil
}

// GangRun is one gang's measurement.
type GangRun struct {
	Name             string
	Created, Running time.Duration
	Requests         map[framework.APIRequest]float64
}

// GangReport is what the gang scenario measured.
type GangReport struct {
	Config GangConfig
	Runs   []GangRun
}

var gangClients = []struct {
	name string
	args []string
}{
	{"loom defaults (QPS 300, burst 600)", nil},
	{"client-go defaults (QPS 20, burst 30)", []string{"--kube-api-qps=20", "--kube-api-burst=30"}},
}

// RunGang runs the gang scenario on env, with only the trainingjob
// controller and no gang scheduler.
func RunGang(ctx context.Context, env *Env, cfg GangConfig) (*GangReport, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	c := env.Cluster
	if _, err := c.CreateNodes(ctx, framework.NodeSpec{Prefix: "gpu", Count: cfg.Nodes, GPUs: 8, Pods: "200"}); err != nil {
		return nil, err
	}
	env.Logf("%d nodes Ready", cfg.Nodes)
	rel, err := env.Install(ctx, "nodeAgent.enabled=false")
	if err != nil {
		return nil, err
	}
	if err := createNamespace(ctx, c, "bench"); err != nil {
		return nil, err
	}
	r := &GangReport{Config: cfg}
	for i, cl := range gangClients {
		run, err := measureGang(ctx, env, rel, cl.name, fmt.Sprintf("gang-%d", i), cfg.Pods, cl.args)
		if err != nil {
			return nil, err
		}
		r.Runs = append(r.Runs, run)
	}
	return r, nil
}

// measureGang runs a fresh manager with extra args, submits the gang and
// times it; the manager is stopped afterwards, the gang deleted.
func measureGang(ctx context.Context, env *Env, rel *framework.Release, name, job string, pods int, args []string) (GangRun, error) {
	r := GangRun{Name: name}
	c, ns := env.Cluster, "bench"
	m, err := env.StartManager(ctx, rel, append([]string{"--controllers=trainingjob", "--gang-scheduler=none"}, args...)...)
	if err != nil {
		return r, err
	}
	defer m.Stop(20 * time.Second)
	tj := trainingJob(ns, job, int32(pods-1), "1")
	obs, err := env.observe(ctx, ns)
	if err != nil {
		return r, err
	}
	defer obs.close()
	sel := client.MatchingLabels{trainingv1alpha1.LabelJobName: job}
	if _, _, err := obs.pods(ctx, sel); err != nil { // its informer starts before the clock
		return r, err
	}
	start := time.Now()
	if err := c.Client.Create(ctx, tj); err != nil {
		return r, err
	}
	if err := poll(ctx, c, 50*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
		n, _, err := obs.pods(ctx, sel)
		return n >= pods, fmt.Sprintf("%s: %d of %d pods created", name, n, pods), err
	}); err != nil {
		return r, err
	}
	r.Created = time.Since(start)
	env.Logf("%s: %d pods created after %s", name, pods, round(r.Created))
	if err := poll(ctx, c, 250*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
		_, n, err := obs.pods(ctx, sel)
		return n == pods, fmt.Sprintf("%s: %d of %d pods running", name, n, pods), err
	}); err != nil {
		return r, err
	}
	r.Running = time.Since(start)
	env.Logf("%s: %d pods running after %s", name, pods, round(r.Running))
	settle()
	after, err := m.Snapshot()
	if err != nil {
		return r, err
	}
	r.Requests = after.Since(m.Ready)
	return r, deleteGang(ctx, c, tj, sel)
}

// deleteGang deletes the gang and waits until its pods are gone, freeing
// the GPUs for the next run.
func deleteGang(ctx context.Context, c *framework.Cluster, tj *trainingv1alpha1.TrainingJob, sel client.MatchingLabels) error {
	if err := c.Client.Delete(ctx, tj, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		return err
	}
	return poll(ctx, c, 500*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
		n, err := countPods(ctx, c, client.InNamespace(tj.Namespace), sel)
		return n == 0, fmt.Sprintf("%d pods of %s still there", n, tj.Name), err
	})
}

// Print writes the report as one table.
func (r *GangReport) Print(w io.Writer) error {
	t := NewTable(w)
	t.Row("gang", "1 master + %d workers, 1 GPU each, %d nodes", r.Config.Pods-1, r.Config.Nodes)
	t.Blank()
	t.Cells("client settings", "all pods created", "pods/s", "all pods running", "manager writes")
	var cols []Column
	for _, run := range r.Runs {
		t.Cells(run.Name, round(run.Created).String(), fmt.Sprintf("%.0f", float64(r.Config.Pods)/run.Created.Seconds()),
			round(run.Running).String(), fmt.Sprintf("%.0f", writes(run.Requests)))
		cols = append(cols, Column{Name: run.Name, Counts: run.Requests})
	}
	t.Requests(cols...)
	return t.Flush()
}
