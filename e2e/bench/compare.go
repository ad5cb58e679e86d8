package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/loom-dev/loom/e2e/framework"
)

// CompareConfig sizes the comparison (`make bench`): Loom side by side with
// the upstream operators it replaces, each contender on a fresh simulated
// cluster of the same nodes with the same objects.
//   - raycluster: Clusters RayClusters of 1 head + 3 workers on Nodes
//     nodes (as many as clusters by default), KubeRay's operator against Loom's manager with only its
//     raycluster controller;
//   - gang: a job of 1 master + GangPods-1 workers (1 GPU each) on
//     GangPods/8 8-GPU nodes, Kubeflow's Training Operator (a PyTorchJob)
//     against Loom (a TrainingJob), and the floor: a plain client creating
//     the same pods with nothing in between;
//   - jobs: Jobs jobs of 1 master + 7 workers (1 GPU each) submitted at once
//     on Jobs 8-GPU nodes, the same three contenders.
//
// Each of Reps repetitions runs every contender once, in an order that
// rotates between repetitions, so that neither always runs on a cold or a
// warm machine.
type CompareConfig struct {
	Clusters, GangPods, Reps int
	// Nodes is the raycluster scenario's node count; 0: Clusters.
	Nodes int
	// Jobs is the jobs scenario's number of jobs; 0: no jobs scenario.
	Jobs int
	// Idle is the idle window after all RayClusters are ready, and after
	// all of a gang's or the jobs' pods run (the floor does not idle).
	Idle time.Duration
	// Only runs one scenario ("raycluster", "gang" or "jobs"); empty: all.
	Only string
	// Skip leaves these contenders out (their columns and ratios show
	// "–"): a shorter run while working on one contender.
	Skip []string
	// Loom is a loom binary; empty: build ./cmd/manager once.
	Loom string
	Logf func(format string, args ...any)
	// ManagerArgs and ManagerEnv are added to Loom's manager.
	ManagerArgs, ManagerEnv []string
	// WarmUp runs the floor once, unmeasured, on a simulated cluster of its
	// own before the first repetition, so that the first contender measured
	// (Loom, in the first repetition's rotation) does not alone start the
	// control plane's binaries and the benchmark's own process cold.
	WarmUp bool
}

// Contenders, as the tables name them.
const (
	contLoom    = "Loom"
	contLoomAll = "Loom, all controllers"
	contKubeRay = "KubeRay"
	contTO      = "Training Operator"
	contFloor   = "floor"
)

// rayContenders are the raycluster scenario's: Loom's manager with only
// its RayCluster controller, the whole platform (every controller on),
// KubeRay's operator, and the floor (rayFloor: only the writes any
// operator must send, nothing else in the way).
var rayContenders = []string{contLoom, contLoomAll, contKubeRay, contFloor}

// Check says whether the configuration can run.
func (cfg CompareConfig) Check() error {
	switch {
	case cfg.Clusters < 1 || cfg.Reps < 1:
		return fmt.Errorf("need clusters >= 1 and reps >= 1")
	case cfg.Nodes < 0:
		return fmt.Errorf("need nodes >= 0 (0: as many as clusters)")
	case cfg.GangPods < 2:
		return fmt.Errorf("need gang-pods >= 2")
	case cfg.Jobs < 0 || (cfg.Only == "jobs" && cfg.Jobs < 1):
		return fmt.Errorf("need jobs >= 1 for the jobs scenario (0: none)")
	case cfg.Only != "" && cfg.Only != "raycluster" && cfg.Only != "gang" && cfg.Only != "jobs":
		return fmt.Errorf("--only: want raycluster, gang or jobs, got %q", cfg.Only)
	}
	for _, c := range cfg.Skip {
		if !slices.Contains(allContenders, c) {
			return fmt.Errorf("--skip: unknown contender %q (want one of %s)", c, strings.Join(allContenders, ", "))
		}
	}
	return nil
}

// allContenders are every scenario's contenders, as --skip names them.
var allContenders = []string{contLoom, contLoomAll, contKubeRay, contTO, contFloor}

// rayNodes is the raycluster scenario's node count.
func (cfg CompareConfig) rayNodes() int {
	if cfg.Nodes > 0 {
		return cfg.Nodes
	}
	return cfg.Clusters
}

// runs says whether the configuration runs scenario.
func (cfg CompareConfig) runs(scenario string) bool {
	if scenario == "jobs" && cfg.Jobs < 1 {
		return false
	}
	return cfg.Only == "" || cfg.Only == scenario
}

// CompareRun is one contender's measurement in one repetition.
type CompareRun struct {
	// Done is the time to all RayClusters ready, or to all of the gang's
	// pods created; Running to all the pods running; Created (RayClusters)
	// to all their pods created.
	Done, Running, Created time.Duration
	// Quiet is the time to the contender's last write while converging
	// (the audit log's; its converging ends 3 s later): an operator may
	// still be writing when its pods are all there.
	Quiet time.Duration
	// Half is the time to half the RayClusters ready: with Done, whether
	// the last ones waited on something the first ones did not.
	Half time.Duration
	// Busy is the share of the machine's CPUs that everything running
	// used from creating the RayClusters to all ready (/proc/stat); Cluster
	// is the CPU seconds the simulated cluster's processes used in that
	// window, by process (kube-apiserver, etcd, kube-scheduler, kwok,
	// kube-controller-manager): when Busy is near 1, the machine, not a
	// contender's wait, bounds Done.
	Busy    float64
	Cluster map[string]float64
	// The process's resident set at its peak (VmHWM) and settled (VmRSS),
	// and the settled one's anonymous and file-backed parts.
	PeakRSS, RSS, AnonRSS, FileRSS int64
	// CPU is the process's CPU seconds while converging, IdleCPU per idle
	// minute.
	CPU, IdleCPU float64
	// ControlPlaneCPU is kube-apiserver's and etcd's CPU seconds over the
	// same converging window: where the simulated control plane is the
	// bound, this says so.
	ControlPlaneCPU float64
	// LimiterWait is the seconds the contender's requests waited for its
	// own client rate limiter while converging, summed over its requests
	// (client-go's rest_client_rate_limiter_duration_seconds): where the
	// contender throttled itself, this says so. NaN for a contender whose
	// metrics do not have it (the anchors' controller-runtime leaves it
	// off).
	LimiterWait float64
	// Writes while converging and per idle minute: client-go's POST, PUT,
	// PATCH and DELETE requests, without Loom's lease renewals and the
	// metrics endpoint's reviews of the benchmark's own scrapes.
	Writes, IdleWrites float64
	// LoomIdle are Loom's own idle writes by verb and resource, apart from
	// its lease (Loom only).
	LoomIdle map[framework.APIRequest]float64
	// AuditWrites and AuditReads are the contender's requests in the API
	// server's audit log over the same window as Writes (the floor's: from
	// its first create to the end of the settle), by verb and resource, told
	// apart by its user agents: its writes, and its gets and live lists
	// (reads around its cache; watches are not logged). AuditInformer are
	// its informers' lists in the window (framework.InformerList: filling
	// its cache, a cache that started late). Without leases and the metrics
	// endpoint's TokenReviews and SubjectAccessReviews, as Writes.
	AuditWrites, AuditReads, AuditInformer map[framework.APIRequest]float64
	// from and to are the converging window, for the audit log.
	from, to time.Time
}

// CompareReport is what the comparison measured: each scenario's runs by
// contender, one a repetition.
type CompareReport struct {
	Config      CompareConfig
	Ray, Gang   map[string][]CompareRun
	Jobs        map[string][]CompareRun
	AnchorNames map[string]string // contender -> "KubeRay ray-operator v1.5.0"
}

// RunCompare runs the comparison.
func RunCompare(ctx context.Context, cfg CompareConfig) (*CompareReport, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Loom == "" {
		dir, err := os.MkdirTemp("", "loom-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if cfg.Loom, err = framework.BuildLoom(dir); err != nil {
			return nil, err
		}
	}
	r := &CompareReport{Config: cfg, Ray: map[string][]CompareRun{}, Gang: map[string][]CompareRun{},
		Jobs: map[string][]CompareRun{}, AnchorNames: map[string]string{}}
	scenarios := []struct {
		name       string
		contenders []string
		runs       map[string][]CompareRun
		measure    func(context.Context, *Env, string) (CompareRun, error)
	}{
		{"raycluster", rayContenders, r.Ray, r.rayRun},
		{"gang", []string{contLoom, contTO, contFloor}, r.Gang, r.gangRun},
		{"jobs", []string{contLoom, contTO, contFloor}, r.Jobs, r.jobsRun},
	}
	if cfg.WarmUp {
		if err := r.warmUp(ctx); err != nil {
			return nil, err
		}
	}
	for rep := range cfg.Reps {
		for _, sc := range scenarios {
			if !cfg.runs(sc.name) {
				continue
			}
			if err := r.repeat(ctx, rep, sc.name, sc.contenders, sc.runs, sc.measure); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// warmUp runs the raycluster floor once at a tenth of the configured size
// (5 RayClusters at least) and discards its figures.
func (r *CompareReport) warmUp(ctx context.Context) error {
	w := &CompareReport{Config: r.Config}
	w.Config.Clusters = max(5, r.Config.Clusters/10)
	w.Config.Nodes = 0
	_, err := w.onFreshCluster(ctx, contFloor, "warm-up (not measured) floor", func(env *Env) (CompareRun, error) {
		return w.rayRun(ctx, env, contFloor)
	})
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	return nil
}

// repeat runs each contender once on a fresh cluster, the order rotated by
// rep, and appends its run to runs.
func (r *CompareReport) repeat(ctx context.Context, rep int, scenario string, contenders []string,
	runs map[string][]CompareRun, measure func(context.Context, *Env, string) (CompareRun, error)) error {
	for i := range contenders {
		name := contenders[(i+rep)%len(contenders)]
		if slices.Contains(r.Config.Skip, name) {
			continue
		}
		run, err := r.onFreshCluster(ctx, name, fmt.Sprintf("%s rep %d/%d %s", scenario, rep+1, r.Config.Reps, name),
			func(env *Env) (CompareRun, error) { return measure(ctx, env, name) })
		if err != nil {
			return fmt.Errorf("%s, %s, repetition %d: %w", scenario, name, rep+1, err)
		}
		runs[name] = append(runs[name], run)
	}
	return nil
}

// onFreshCluster brings a simulated cluster up with an audit log, runs f on
// it, reads contender name's requests from the log and takes the cluster
// down again.
func (r *CompareReport) onFreshCluster(ctx context.Context, name, what string, f func(*Env) (CompareRun, error)) (CompareRun, error) {
	cfg := r.Config
	logf := func(format string, args ...any) { cfg.Logf("%s: %s", what, fmt.Sprintf(format, args...)) }
	env, err := Up(ctx, UpOptions{Loom: cfg.Loom, Logf: logf, ManagerArgs: cfg.ManagerArgs, ManagerEnv: cfg.ManagerEnv, Audit: true})
	if err != nil {
		return CompareRun{}, err
	}
	defer env.Down()
	run, err := f(env)
	if err != nil {
		return run, err
	}
	// The contender has stopped: every request of its window is in the log.
	return run, run.audit(env.Cluster, name, r.programs(name))
}

// programs are contender name's user agents' program names, as the audit
// log records them (seen in the logs), its main client's first:
//   - Loom's manager sets "loom-manager"; its leader election's client keeps
//     client-go's default, the binary's name ("loom/v0.0.0 …/leader-election");
//   - KubeRay sets "kuberay-operator/v1.5.0"; a clientset it makes at start
//     keeps the default ("ray-operator/v0.0.0 …");
//   - the Training Operator keeps the default ("training-operator.v1/…");
//   - the floor's client is named apart from the benchmark's own.
func (r *CompareReport) programs(name string) []string {
	switch name {
	case contLoom, contLoomAll:
		return []string{"loom-manager", filepath.Base(r.Config.Loom)}
	case contKubeRay:
		return []string{"kuberay-operator", "ray-operator"}
	case contTO:
		return []string{"training-operator.v1"}
	}
	return []string{floorAgent}
}

// audit fills run's audit figures from the cluster's audit log over its
// window. A contender whose main program has no request in the whole log
// is a user agent the benchmark has wrong: an error, not a row of zeros.
func (run *CompareRun) audit(c *framework.Cluster, name string, programs []string) error {
	counts, err := c.Audit(run.from, run.to)
	if err != nil {
		return err
	}
	if _, ok := counts[programs[0]]; !ok {
		all, err := c.Audit(time.Time{}, time.Time{})
		if err != nil {
			return err
		}
		if _, ok := all[programs[0]]; !ok {
			return fmt.Errorf("no request of %s's user agent %q in the audit log %s; programs seen: %s",
				name, programs[0], c.AuditLog, strings.Join(all.Programs(), ", "))
		}
	}
	writes, reads, informer := counts.Split(programs...)
	run.AuditWrites, run.AuditReads, run.AuditInformer = pick(writes, notArtefact), pick(reads, notArtefact), pick(informer, notArtefact)
	return nil
}

// notArtefact leaves out what Writes leaves out of Loom's requests (see
// benchArtefacts): its lease and its metrics endpoint's reviews.
func notArtefact(k framework.APIRequest) bool {
	return !isLease(k) && k.Resource != "tokenreviews" && k.Resource != "subjectaccessreviews"
}

// WritesByKind is AuditWrites in one line, the largest count first:
// "pods create 400 · services create 100".
func (run CompareRun) WritesByKind() string { return byKind(run.AuditWrites) }

// ReadsByKind is AuditReads in one line, as WritesByKind.
func (run CompareRun) ReadsByKind() string { return byKind(run.AuditReads) }

func byKind(m map[framework.APIRequest]float64) string {
	var parts []string
	for _, k := range framework.ByCount(m) {
		parts = append(parts, fmt.Sprintf("%s %s %.0f", k.Resource, k.Verb, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " · ")
}

func total(m map[framework.APIRequest]float64) (n float64) {
	for _, v := range m {
		n += v
	}
	return n
}

// contender is one operator process under comparison.
type contender interface {
	PID() int
	metrics() (string, error)
	halt()
}

type loomContender struct{ *Manager }

func (l loomContender) metrics() (string, error) { return l.Metrics(l.token) }
func (l loomContender) halt()                    { l.Stop(20 * time.Second) }

type anchorContender struct{ *framework.Anchor }

func (a anchorContender) metrics() (string, error) { return a.Metrics() }
func (a anchorContender) halt()                    { a.Stop(20 * time.Second) }

// startContender starts name's operator on env: Loom's chart and manager
// with only loomController, or the anchor.
func (r *CompareReport) startContender(ctx context.Context, env *Env, name, loomController string) (contender, error) {
	var a *framework.Anchor
	var err error
	switch name {
	case contLoom, contLoomAll:
		rel, err := env.Install(ctx, "nodeAgent.enabled=false")
		if err != nil {
			return nil, err
		}
		args := []string{"--controllers=" + loomController, "--gang-scheduler=none"}
		if name == contLoomAll {
			args = args[1:] // every controller, as the chart runs it
		}
		m, err := env.StartManager(ctx, rel, args...)
		if err != nil {
			return nil, err
		}
		return loomContender{m}, nil
	case contKubeRay:
		a, err = env.Cluster.StartKubeRay(ctx)
	case contTO:
		a, err = env.Cluster.StartTrainingOperator(ctx)
	default:
		return nil, fmt.Errorf("no operator for %s", name)
	}
	if err != nil {
		return nil, err
	}
	r.AnchorNames[name] = a.Name + " " + a.Version
	return anchorContender{a}, nil
}

// sample is a contender at one moment.
type sample struct {
	// at is when the sample began: a bound of the audit log's window.
	at     time.Time
	writes float64
	// loom is loom_api_requests_total (Loom only).
	loom                  map[framework.APIRequest]float64
	rss, peak, anon, file int64
	cpu                   float64
	// limiter is rest_client_rate_limiter_duration_seconds_sum, NaN
	// without it.
	limiter float64
}

// takeSample scrapes the contender's metrics, then reads its /proc status.
func takeSample(c contender) (sample, error) {
	at := time.Now()
	text, err := c.metrics()
	if err != nil {
		return sample{}, err
	}
	if len(framework.Samples(text, "rest_client_requests_total")) == 0 {
		return sample{}, fmt.Errorf("no rest_client_requests_total in the metrics")
	}
	s := sample{at: at, loom: framework.ParseAPIRequests(text)}
	s.writes = framework.RESTClientWrites(text) - benchArtefacts(s.loom)
	if v, ok := framework.MetricSum(text, "rest_client_rate_limiter_duration_seconds_sum"); ok {
		s.limiter = v
	} else {
		s.limiter = math.NaN()
	}
	pid := c.PID()
	s.rss, _ = framework.RSS(pid)
	s.peak, _ = framework.PeakRSS(pid)
	s.anon, _ = framework.AnonRSS(pid)
	s.file, _ = framework.FileRSS(pid)
	if s.cpu, err = framework.CPUSeconds(pid); err != nil {
		return sample{}, err
	}
	return s, nil
}

// benchArtefacts are Loom's writes that are not reconciliation: its lease
// renewals (the anchors run without leader election) and the TokenReviews
// and SubjectAccessReviews its metrics endpoint sends to authenticate the
// benchmark's scrapes (the anchors' endpoints are plain HTTP).
func benchArtefacts(loom map[framework.APIRequest]float64) (n float64) {
	for k, v := range loom {
		switch {
		case k.Verb == "get" || k.Verb == "list" || k.Verb == "watch":
		case isLease(k), k.Resource == "tokenreviews", k.Resource == "subjectaccessreviews":
			n += v
		}
	}
	return n
}

// converged fills run from the samples at the start (s0) and at the end of
// converging (s1).
func (run *CompareRun) converged(s0, s1 sample) {
	run.PeakRSS = s1.peak
	run.RSS, run.AnonRSS, run.FileRSS = s1.rss, s1.anon, s1.file
	run.CPU = s1.cpu - s0.cpu
	run.Writes = s1.writes - s0.writes
	run.LimiterWait = s1.limiter - s0.limiter
	run.from, run.to = s0.at, s1.at
}

// idled fills run's idle figures from the samples around an idle window d
// (the settled RSS is the one after it).
func (run *CompareRun) idled(s1, s2 sample, d time.Duration) {
	run.RSS, run.AnonRSS, run.FileRSS = s2.rss, s2.anon, s2.file
	run.PeakRSS = s2.peak
	run.IdleCPU = (s2.cpu - s1.cpu) / d.Minutes()
	run.IdleWrites = (s2.writes - s1.writes) / d.Minutes()
	if len(s2.loom) > 0 {
		run.LoomIdle = pick(diff(s2.loom, s1.loom), func(k framework.APIRequest) bool { return isWrite(k) && !isLease(k) })
	}
}
