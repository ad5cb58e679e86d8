package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/loom-dev/loom/e2e/framework"
)

// rayRun is the raycluster scenario for one contender on a fresh env: the
// nodes, the operator, then the RayClusters timed to all ready, the wait
// for the operator's writes to stop (the floor: a settle), and the idle
// window.
func (r *CompareReport) rayRun(ctx context.Context, env *Env, name string) (CompareRun, error) {
	c, n, ns := env.Cluster, r.Config.Clusters, "bench"
	var run CompareRun
	if _, err := c.CreateNodes(ctx, framework.NodeSpec{Prefix: "node", Count: r.Config.rayNodes()}); err != nil {
		return run, err
	}
	if err := createNamespace(ctx, c, ns); err != nil {
		return run, err
	}
	var op contender
	var s0 sample
	var floor *rayFloor
	var err error
	if name == contFloor {
		if err := c.InstallKubeRayCRDs(ctx); err != nil {
			return run, err
		}
		if floor, err = startRayFloor(ctx, c, ns); err != nil {
			return run, err
		}
		defer func() { _, _ = floor.stop() }()
	} else {
		if op, s0, err = r.startSampled(ctx, env, name, "raycluster"); err != nil {
			return run, err
		}
		defer op.halt()
	}
	obs, err := env.observe(ctx, ns)
	if err != nil {
		return run, err
	}
	defer obs.close()
	if _, err := obs.readyRayClusters(ctx); err != nil { // its informer starts before the clock
		return run, err
	}
	defer env.profileAPIServer(ctx)()
	start, cp0, m0, pc0 := time.Now(), controlPlaneCPU(c), machineCPU(), clusterCPU(c)
	if err := createRayClusters(ctx, c, ns, n); err != nil {
		return run, err
	}
	if err := poll(ctx, c, 250*time.Millisecond, 15*time.Minute, func() (bool, string, error) {
		if floor != nil {
			if err := floor.failed(); err != nil {
				return false, "", err
			}
		}
		ready, err := obs.readyRayClusters(ctx)
		if run.Half == 0 && 2*ready >= n {
			run.Half = time.Since(start)
		}
		return ready == n, fmt.Sprintf("%d of %d RayClusters ready", ready, n), err
	}); err != nil {
		return run, err
	}
	run.Done = time.Since(start)
	run.Busy, run.Cluster = machineCPU().share(m0), diff(clusterCPU(c), pc0)
	env.Logf("%d RayClusters ready after %s", n, round(run.Done))
	if err := podsTimeline(c, &run, ns, start); err != nil {
		env.Logf("no pods' timeline (its rows stay 0): %v", err) // a diagnostic, not the measurement
	}
	if floor != nil {
		settle()
		run.ControlPlaneCPU = controlPlaneCPU(c) - cp0
		w, err := floor.stop()
		run.Writes, run.from, run.to = float64(w), start, time.Now()
		return run, err
	}
	return run, r.convergeAndIdle(env, name, op, &run, start, s0, cp0)
}

// quietRule ends converging once the contender has sent no write for 3 s
// (at least a settle's length after its work is done), or after 3 minutes
// for one that never stops: then the idle window counts the rest.
var quietRule = quietness{quiet: 3 * time.Second, limit: 3 * time.Minute, every: time.Second}

// quietness is when converging ends: no write for quiet, scraped every
// every, or limit after it began.
type quietness struct{ quiet, limit, every time.Duration }

// convergeAndIdle ends the converging phase once op's writes stop (see
// converge), then idles. start is when the workload was submitted.
func (r *CompareReport) convergeAndIdle(env *Env, name string, op contender, run *CompareRun, start time.Time, s0 sample, cp0 float64) error {
	s1, last, err := quietRule.converge(env.Logf, op)
	if err != nil {
		return err
	}
	run.ControlPlaneCPU = controlPlaneCPU(env.Cluster) - cp0
	run.converged(s0, s1)
	// The scrapes bound the last write; the audit log has its time.
	if t, err := lastWrite(env.Cluster, r.programs(name), start); err == nil && t.After(start) && t.Before(last) {
		last = t
	}
	run.Quiet = last.Sub(start)
	env.Logf("last write %s after the start", round(run.Quiet))
	env.Logf("idle for %s", r.Config.Idle)
	time.Sleep(r.Config.Idle)
	s2, err := takeSample(op)
	if err != nil {
		return err
	}
	run.idled(s1, s2, r.Config.Idle)
	return nil
}

// lastWrite is the time of the last write from start on that the audit log
// has from programs (user agents' programs), leases and the metrics
// endpoint's reviews left out; the zero time: none.
func lastWrite(c *framework.Cluster, programs []string, start time.Time) (time.Time, error) {
	return c.LastAudit(start, func(ev framework.AuditEvent) bool {
		k := ev.Request
		return slices.Contains(programs, framework.Program(ev.UserAgent)) && isWrite(k) && k.Verb != framework.InformerList && notArtefact(k)
	})
}

// converge waits until op has sent no write for q.quiet, scraping its
// writes every q.every, and returns the sample that ends its converging
// window and when its last write was seen (within q.every of it). An
// operator whose pods are all there may still be writing: the Training
// Operator creates a Service for each pod, at its own client's rate, after
// the pods; those writes are its converging, not its idle.
func (q quietness) converge(logf func(string, ...any), op contender) (s sample, last time.Time, err error) {
	if s, err = takeSample(op); err != nil {
		return s, last, err
	}
	last = s.at
	for limit := s.at.Add(q.limit); time.Since(last) < q.quiet; {
		if time.Now().After(limit) {
			logf("still writing after %s: the idle window counts the rest", q.limit)
			return s, last, nil
		}
		time.Sleep(q.every)
		n, err := takeSample(op)
		if err != nil {
			return s, last, err
		}
		if n.writes != s.writes {
			last = n.at
		}
		s = n
	}
	return s, last, nil
}

// gangRun is the gang scenario for one contender on a fresh env: one job
// of GangPods pods.
func (r *CompareReport) gangRun(ctx context.Context, env *Env, name string) (CompareRun, error) {
	return r.podsRun(ctx, env, name, gangShape{jobs: 1, pods: r.Config.GangPods})
}

// podsRun is a gang-like scenario for one contender on a fresh env: the
// nodes, the operator (none for the floor), then the jobs (or the floor's
// pods) timed to all pods created and to all running, then for the floor a
// settle, for an operator the wait for its writes to stop and the idle
// window while its jobs run.
func (r *CompareReport) podsRun(ctx context.Context, env *Env, name string, shape gangShape) (CompareRun, error) {
	c, pods, ns := env.Cluster, shape.total(), "bench"
	var run CompareRun
	if _, err := c.CreateNodes(ctx, framework.NodeSpec{Prefix: "gpu", Count: (pods + 7) / 8, GPUs: 8, Pods: "200"}); err != nil {
		return run, err
	}
	if err := createNamespace(ctx, c, ns); err != nil {
		return run, err
	}
	var op contender
	var s0 sample
	if name != contFloor {
		var err error
		if op, s0, err = r.startSampled(ctx, env, name, "trainingjob"); err != nil {
			return run, err
		}
		defer op.halt()
	}
	submit, err := gangSubmitter(c, name, ns, shape)
	if err != nil {
		return run, err
	}
	from, cp0 := time.Now(), controlPlaneCPU(c)
	if err := timeGang(ctx, env, &run, pods, ns, submit); err != nil {
		return run, err
	}
	if op == nil {
		settle()
		run.ControlPlaneCPU = controlPlaneCPU(c) - cp0
		run.Writes = float64(pods) // the floor's client sent one create a pod, nothing else
		run.from, run.to = from, time.Now()
		return run, nil
	}
	// An operator's jobs then run on: whatever it writes about a running
	// job is its idle writes.
	return run, r.convergeAndIdle(env, name, op, &run, from, s0, cp0)
}

// timeGang runs submit in the background and times the namespace's pods
// to all created and to all running, polling alike for every contender.
func timeGang(ctx context.Context, env *Env, run *CompareRun, pods int, ns string, submit func(context.Context) error) error {
	c := env.Cluster
	obs, err := env.observe(ctx, ns)
	if err != nil {
		return err
	}
	defer obs.close()
	if _, _, err := obs.pods(ctx); err != nil { // its informer starts before the clock
		return err
	}
	defer env.profileAPIServer(ctx)()
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- submit(ctx) }()
	if err := poll(ctx, c, 50*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
		select {
		case err := <-errc:
			if err != nil {
				return false, "", err
			}
		default:
		}
		n, _, err := obs.pods(ctx)
		return n >= pods, fmt.Sprintf("%d of %d pods created", n, pods), err
	}); err != nil {
		return err
	}
	run.Done = time.Since(start)
	// The informer's events lag the creates on a busy API server: the audit
	// log says when the last create was answered.
	if last, err := c.LastAudit(start, func(ev framework.AuditEvent) bool {
		return ev.Verb == "create" && ev.Request.Resource == "pods" && ev.Namespace == ns && ev.Code/100 == 2
	}); err == nil && last.After(start) {
		run.Done = last.Sub(start)
	}
	env.Logf("%d pods created after %s", pods, round(run.Done))
	if err := poll(ctx, c, 250*time.Millisecond, 10*time.Minute, func() (bool, string, error) {
		_, n, err := obs.pods(ctx)
		return n == pods, fmt.Sprintf("%d of %d pods running", n, pods), err
	}); err != nil {
		return err
	}
	run.Running = time.Since(start)
	env.Logf("%d pods running after %s", pods, round(run.Running))
	return nil
}

// podsTimeline sets run's Created and Running from the audit log: when the
// last of the namespace's pods was created, and when kwok last patched one's
// status (kwok plays a pod's start in one patch: Running and Ready). With
// Done they tell where a contender's time went: into creating the pods, the
// simulated cluster's scheduling and starting them, or its own status
// write after they ran.
func podsTimeline(c *framework.Cluster, run *CompareRun, ns string, start time.Time) error {
	last := func(verb, resource, program string) (time.Duration, error) {
		t, err := c.LastAudit(start, func(ev framework.AuditEvent) bool {
			return ev.Namespace == ns && ev.Request == framework.APIRequest{Verb: verb, Resource: resource} && ev.Code/100 == 2 &&
				(program == "" || framework.Program(ev.UserAgent) == program)
		})
		if err != nil || t.IsZero() {
			return 0, err
		}
		return t.Sub(start), nil
	}
	var err1, err2 error
	run.Created, err1 = last("create", "pods", "")
	run.Running, err2 = last("patch", "pods/status", "kwok")
	return errors.Join(err1, err2)
}

// floorAgent is the floor's client's user agent: the audit log tells its
// requests from the benchmark's own polls by it.
const floorAgent = "loom-bench-floor"

// floorConfig is the floor's client configuration: no client-side rate
// limit, its own user agent, and for the built-in kinds (proto) protobuf,
// as Loom's and the anchors' controller-runtime clients send: the API
// server decodes and encodes it for less than JSON, so the floor is no
// dearer than an operator's requests.
func floorConfig(c *framework.Cluster, proto bool) *rest.Config {
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS = -1
	cfg.UserAgent = floorAgent
	if proto {
		cfg.ContentType = runtime.ContentTypeProtobuf
		cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	return cfg
}

// gangSubmitter returns what creates the contender's jobs: Loom's
// TrainingJobs, the Training Operator's PyTorchJobs (all at once), or, for
// the floor, the pods themselves from a client without a rate limit, 32
// creates in flight.
func gangSubmitter(c *framework.Cluster, name, ns string, shape gangShape) (func(context.Context) error, error) {
	workers := shape.pods - 1
	switch name {
	case contLoom:
		return func(ctx context.Context) error {
			return parallel(shape.jobs, func(i int) error {
				return c.Client.Create(ctx, trainingJob(ns, shape.job(i), int32(workers), "1"))
			})
		}, nil
	case contTO:
		return func(ctx context.Context) error {
			return parallel(shape.jobs, func(i int) error { return c.Client.Create(ctx, pyTorchJob(ns, shape.job(i), workers)) })
		}, nil
	}
	// A typed clientset: no discovery, so the floor's requests are its
	// pods' creates and nothing else.
	cs, err := kubernetes.NewForConfig(floorConfig(c, true))
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return parallel(shape.total(), func(i int) error {
			_, err := cs.CoreV1().Pods(ns).Create(ctx, floorPod(ns, shape.pod(i)), metav1.CreateOptions{})
			return err
		})
	}, nil
}

// pyTorchJob is the Training Operator's job of the same shape as Loom's
// TrainingJob: a master and workers with the same pod template (1 GPU).
func pyTorchJob(ns, name string, workers int) *unstructured.Unstructured {
	replica := func(n int) map[string]any {
		t := gpuTemplate("1")
		tmpl, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&t)
		return map[string]any{"replicas": int64(n), "restartPolicy": "OnFailure", "template": tmpl}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubeflow.org/v1",
		"kind":       "PyTorchJob",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"pytorchReplicaSpecs": map[string]any{
			"Master": replica(1),
			"Worker": replica(workers),
		}},
	}}
	return u
}

// floorPod is a floor's pod: the gang's pod template, nothing else.
func floorPod(ns, name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: gpuTemplate("1").Spec}
}

// cpuSample is the machine's busy and total CPU seconds at one time.
type cpuSample struct{ busy, total float64 }

func machineCPU() cpuSample {
	b, t, _ := framework.MachineCPU() // no /proc/stat: shares of 0
	return cpuSample{b, t}
}

// share is the busy share of the machine's CPU time since s0.
func (s cpuSample) share(s0 cpuSample) float64 {
	if s.total <= s0.total {
		return 0
	}
	return (s.busy - s0.busy) / (s.total - s0.total)
}

// clusterCPU is the CPU seconds each process of the simulated cluster has
// used so far, by name.
func clusterCPU(c *framework.Cluster) map[string]float64 {
	out := map[string]float64{}
	for _, p := range c.Processes() {
		if s, err := framework.CPUSeconds(p.PID()); err == nil {
			out[p.Name] += s
		}
	}
	return out
}

// controlPlaneCPU is the CPU seconds kube-apiserver and etcd have used so
// far: what a contender's requests cost the control plane shows in its
// difference over a window (the scheduler and kwok do the same work for
// every contender).
func controlPlaneCPU(c *framework.Cluster) float64 {
	cpu := clusterCPU(c)
	return cpu["kube-apiserver"] + cpu["etcd"]
}

// startSampled starts contender name (Loom's manager with controller, or
// an anchor) and takes its first sample; the caller halts it.
func (r *CompareReport) startSampled(ctx context.Context, env *Env, name, controller string) (contender, sample, error) {
	op, err := r.startContender(ctx, env, name, controller)
	if err != nil {
		return nil, sample{}, err
	}
	s0, err := takeSample(op)
	if err != nil {
		op.halt()
		return nil, sample{}, err
	}
	return op, s0, nil
}
