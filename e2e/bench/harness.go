package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/e2e/framework"
	"github.com/loom-dev/loom/internal/apply"
)

// Env is a running simulated cluster and the loom binary to run on it: what
// every scenario, and the demo, starts from.
type Env struct {
	Cluster *framework.Cluster
	// Loom is the loom binary's absolute path.
	Loom string
	Logf func(format string, args ...any)
	// ManagerArgs and ManagerEnv are added to every manager StartManager
	// runs (after the scenario's own flags, so they win).
	ManagerArgs, ManagerEnv []string
}

// UpOptions configure Up.
type UpOptions struct {
	// Loom is a loom binary (loom-node-agent beside it); empty: build both
	// (or LOOM_BINARY).
	Loom string
	// Dir holds the cluster's data and logs; empty: a temporary directory,
	// removed by Down unless LOOM_E2E_KEEP is set.
	Dir  string
	Logf func(format string, args ...any)
	// ManagerArgs and ManagerEnv become the Env's.
	ManagerArgs, ManagerEnv []string
	// Audit starts the API server with an audit log (framework.Options).
	Audit bool
}

// Up starts the simulated cluster and finds or builds the loom binary.
func Up(ctx context.Context, opts UpOptions) (*Env, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	c, err := framework.Start(ctx, framework.Options{Dir: opts.Dir, Logf: opts.Logf, KeepDir: os.Getenv("LOOM_E2E_KEEP") != "", Audit: opts.Audit,
		Profiling: os.Getenv("LOOM_E2E_PROFILE") != ""})
	if err != nil {
		return nil, err
	}
	loom := opts.Loom
	if loom == "" {
		loom, err = framework.BuildLoom(c.Dir)
	} else {
		loom, err = filepath.Abs(loom)
	}
	if err != nil {
		c.Stop()
		return nil, err
	}
	return &Env{Cluster: c, Loom: loom, Logf: opts.Logf, ManagerArgs: opts.ManagerArgs, ManagerEnv: opts.ManagerEnv}, nil
}

// Down stops every process of the cluster.
func (e *Env) Down() { e.Cluster.Stop() }

// Install installs the chart as release loom in loom-system, with extra
// --set values.
func (e *Env) Install(ctx context.Context, set ...string) (*framework.Release, error) {
	return e.Cluster.InstallChart(ctx, "loom", "loom-system", set...)
}

// Manager is a manager StartManager ran, ready and leading.
type Manager struct {
	*framework.Manager
	// Ready is its snapshot once it was ready and leading.
	Ready Snapshot
	token string
}

// StartManager runs a manager of release rel with args, then e.ManagerArgs
// and e.ManagerEnv, waits until it is ready and holds the leader lease, and
// takes its Ready snapshot.
func (e *Env) StartManager(ctx context.Context, rel *framework.Release, args ...string) (*Manager, error) {
	all := append(append([]string{}, args...), e.ManagerArgs...)
	fm, err := e.Cluster.RunManagerEnv(ctx, e.Loom, rel, e.ManagerEnv, all...)
	if err != nil {
		return nil, err
	}
	m := &Manager{Manager: fm, token: e.Cluster.Config.BearerToken}
	err = e.Cluster.WaitReady(ctx, fm, rel.Namespace, "loom-manager", 3*time.Minute)
	if err == nil {
		// Ready comes from the probe port; the metrics server (with its
		// authentication) may start listening a moment later.
		err = poll(ctx, e.Cluster, 200*time.Millisecond, 30*time.Second, func() (bool, string, error) {
			var serr error
			m.Ready, serr = m.Snapshot()
			return serr == nil, fmt.Sprintf("manager metrics: %v", serr), nil
		})
	}
	if err != nil {
		fm.Stop(20 * time.Second)
		return nil, err
	}
	return m, nil
}

// Scrape is the manager's /metrics text ("" when it cannot be read).
func (m *Manager) Scrape() string {
	text, _ := m.Metrics(m.token)
	return text
}

// Snapshot is the manager at one moment: its API request counters
// (loom_api_requests_total) and its process's memory and CPU time.
type Snapshot struct {
	Requests              map[framework.APIRequest]float64
	RSS, PeakRSS, FileRSS int64
	CPU                   time.Duration
}

// Snapshot reads the manager's counters, then its /proc status.
func (m *Manager) Snapshot() (Snapshot, error) {
	reqs, err := m.APIRequests(m.token)
	if err != nil {
		return Snapshot{}, err
	}
	s := Snapshot{Requests: reqs}
	pid := m.PID()
	s.RSS, _ = framework.RSS(pid)
	s.PeakRSS, _ = framework.PeakRSS(pid)
	s.FileRSS, _ = framework.FileRSS(pid)
	cpu, _ := framework.CPUSeconds(pid)
	s.CPU = seconds(cpu)
	return s, nil
}

// busyThenIdle snapshots the manager at the end of a busy phase, and again
// after an idle window d.
func (m *Manager) busyThenIdle(d time.Duration) (busy, idle Snapshot, err error) {
	if busy, err = m.Snapshot(); err != nil {
		return busy, idle, err
	}
	time.Sleep(d)
	idle, err = m.Snapshot()
	return busy, idle, err
}

// Since is the requests made between prev and s.
func (s Snapshot) Since(prev Snapshot) map[framework.APIRequest]float64 {
	return diff(s.Requests, prev.Requests)
}

// settle waits for the manager's last coalesced status writes to land before
// a snapshot ends a phase.
func settle() { time.Sleep(3 * time.Second) }

// poll checks cond every `every` until it holds, failing when a cluster
// process died, ctx ended or timeout passed (0: no timeout).
func poll(ctx context.Context, c *framework.Cluster, every, timeout time.Duration, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, what, err := cond()
		if err != nil || ok {
			return err
		}
		if err := c.Check(); err != nil {
			return err
		}
		if timeout > 0 && time.Now().After(deadline) {
			return fmt.Errorf("after %s: %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

// Watch returns nil when ctx ends, or an error as soon as a process of the
// cluster dies.
func (e *Env) Watch(ctx context.Context) error {
	err := poll(ctx, e.Cluster, 5*time.Second, 0, func() (bool, string, error) { return false, "", nil })
	if errors.Is(err, ctx.Err()) {
		return nil
	}
	return fmt.Errorf("a process of the simulated cluster died: %w", err)
}

// Logger returns a progress logger writing "[  12.3s] …" lines to w, timed
// from now.
func Logger(w io.Writer) func(format string, args ...any) {
	t0 := time.Now()
	return func(format string, args ...any) {
		fmt.Fprintf(w, "[%6.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
	}
}

// parallel runs f(i) for i in [0, n) with 32 in flight.
func parallel(n int, f func(i int) error) error {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return apply.Each(idx, 32, f)
}

func createNamespace(ctx context.Context, c *framework.Cluster, name string) error {
	return client.IgnoreAlreadyExists(c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
}

// countPods lists pods' metadata only: the benchmark must not be what loads
// the API server.
func countPods(ctx context.Context, c *framework.Cluster, opts ...client.ListOption) (int, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	err := c.Client.List(ctx, list, opts...)
	return len(list.Items), err
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func diff[K comparable](after, before map[K]float64) map[K]float64 {
	out := map[K]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// isWrite says whether a request changes the cluster.
func isWrite(k framework.APIRequest) bool {
	switch k.Verb {
	case "get", "list", "watch":
		return false
	}
	// The metrics endpoint authenticates each scrape (TokenReview,
	// SubjectAccessReview): the benchmark's own reads, not reconciliation.
	return k.Resource != "tokenreviews" && k.Resource != "subjectaccessreviews"
}

func isLease(k framework.APIRequest) bool { return strings.HasPrefix(k.Resource, "leases") }

// writes counts the writes of m apart from the leader-election lease.
func writes(m map[framework.APIRequest]float64) (n float64) {
	for k, v := range m {
		if isWrite(k) && !isLease(k) {
			n += v
		}
	}
	return n
}

func pick(m map[framework.APIRequest]float64, keep func(framework.APIRequest) bool) map[framework.APIRequest]float64 {
	out := map[framework.APIRequest]float64{}
	for k, v := range m {
		if v != 0 && keep(k) {
			out[k] = v
		}
	}
	return out
}

// profileAPIServer, with LOOM_E2E_PROFILE=SECONDS in the environment,
// takes kube-apiserver's CPU profile over that many seconds from now into
// the cluster's directory (kept with LOOM_E2E_KEEP=1); the returned func
// waits for it.
func (e *Env) profileAPIServer(ctx context.Context) (wait func()) {
	secs, _ := strconv.Atoi(os.Getenv("LOOM_E2E_PROFILE"))
	if secs <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		b, err := e.Cluster.CPUProfile(ctx, time.Duration(secs)*time.Second)
		path := filepath.Join(e.Cluster.Dir, "apiserver-cpu.pprof")
		if err == nil {
			err = os.WriteFile(path, b, 0o644)
		}
		if err != nil {
			e.Logf("kube-apiserver's CPU profile: %v", err)
			return
		}
		e.Logf("kube-apiserver's CPU profile over %ds: %s", secs, path)
	}()
	return func() { <-done }
}
