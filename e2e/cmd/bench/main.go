// Command bench runs one of Loom's benchmarks on the simulated cluster
// (package e2e/bench) and prints its table:
//
//	go run ./e2e/cmd/bench compare --clusters 100 --gang-pods 512 --jobs 20 --reps 3   # make bench
//	go run ./e2e/cmd/bench [fleet] [--nodes 1000] ...   # make bench-fleet
//	go run ./e2e/cmd/bench gpu-stack --nodes 500        # make bench-gpu-stack
//	go run ./e2e/cmd/bench gang --pods 512 --nodes 64   # make bench-training
//	go run ./e2e/cmd/bench raycluster --clusters 100    # make bench-raycluster
//	go run ./e2e/cmd/bench pending --jobs 500 --nodes 16 # waiting jobs while GPUs churn
//
// Every scenario takes --loom (a loom binary, loom-node-agent beside it;
// default: build both),
// --manager-env KEY=VALUE, and extra manager flags after "--".
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/loom-dev/loom/e2e/bench"
)

// A scenario registers its flags and returns what runs it.
type scenario struct {
	doc   string
	flags func(fs *flag.FlagSet) job
}

// A job checks the parsed flags (before the cluster starts), then measures
// on one cluster, or, standalone, brings up clusters itself.
type job struct {
	check      func() error
	measure    func(ctx context.Context, env *bench.Env) (printer, error)
	standalone func(ctx context.Context, up bench.UpOptions) (printer, error)
}

type printer interface{ Print(w io.Writer) error }

var scenarios = map[string]scenario{
	"fleet":      {"GPU nodes with their inventory, a ClusterPolicy, a gang, jobs, RayClusters, idle (the default)", fleet},
	"gpu-stack":  {"ClusterPolicy apply to Ready and the manager's API requests on GPU nodes", gpuStack},
	"gang":       {"pods/s creating a TrainingJob gang at Loom's and client-go's client limits", gang},
	"raycluster": {"RayClusters × 4 pods to all ready, the manager's RSS and writes", rayCluster},
	"pending":    {"TrainingJobs waiting for GPUs while others finish and start: the manager's writes per minute", pending},
	"compare":    {"Loom side by side with KubeRay and the Training Operator, a fresh cluster each; one table of ratios (make bench)", compare},
}

var scenarioNames = []string{"fleet", "gpu-stack", "gang", "raycluster", "pending", "compare"}

func main() {
	ctrllog.SetLogger(logr.Discard()) // the benchmark's own clients: no stack trace
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	name := "fleet"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	sc, ok := scenarios[name]
	if !ok {
		return fmt.Errorf("unknown scenario %q; want one of %s", name, strings.Join(scenarioNames, ", "))
	}
	fs := flag.NewFlagSet("bench "+name, flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: bench [scenario] [flags] [-- manager flags]; scenarios:\n")
		for _, n := range scenarioNames {
			fmt.Fprintf(fs.Output(), "  %-10s  %s\n", n, scenarios[n].doc)
		}
		fmt.Fprintf(fs.Output(), "flags of %s:\n", name)
		fs.PrintDefaults()
	}
	up := bench.UpOptions{Logf: bench.Logger(os.Stderr)}
	fs.StringVar(&up.Loom, "loom", "", "loom binary, with loom-node-agent beside it for the agents the fleet scenario runs (default: build both)")
	fs.Func("manager-env", "KEY=VALUE for the manager's environment (repeatable), e.g. GOGC=50", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want KEY=VALUE, got %q", v)
		}
		up.ManagerEnv = append(up.ManagerEnv, v)
		return nil
	})
	j := sc.flags(fs)
	_ = fs.Parse(args) // ExitOnError
	up.ManagerArgs = fs.Args()
	if j.check != nil {
		if err := j.check(); err != nil {
			return err
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	if j.standalone != nil {
		r, err := j.standalone(ctx, up)
		if err != nil {
			return err
		}
		up.Logf("done in %s", time.Since(t0).Round(time.Second))
		return r.Print(os.Stdout)
	}
	env, err := bench.Up(ctx, up)
	if err != nil {
		return err
	}
	defer env.Down()
	r, err := j.measure(ctx, env)
	if err != nil {
		return err
	}
	env.Logf("done in %s", time.Since(t0).Round(time.Second))
	return r.Print(os.Stdout)
}

func fleet(fs *flag.FlagSet) job {
	cfg := bench.Config{}
	fs.IntVar(&cfg.Nodes, "nodes", 1000, "simulated 8-GPU nodes")
	fs.IntVar(&cfg.Agents, "agents", 5, "nodes whose inventory comes from a real node-agent process (measured); the benchmark publishes the rest")
	fs.DurationVar(&cfg.AgentInterval, "agent-interval", 5*time.Second, "the measured agents' collection interval")
	fs.IntVar(&cfg.GangPods, "gang", 512, "pods of the large TrainingJob (1 GPU each)")
	fs.IntVar(&cfg.SmallJobs, "jobs", 8, "small TrainingJobs (2 pods × 8 GPUs)")
	fs.IntVar(&cfg.RayClusters, "rayclusters", 20, "RayClusters of 1 head + 3 workers")
	fs.IntVar(&cfg.BackgroundPods, "background-pods", 2400, "other pods in the cluster (with the defaults, 10,000 pods in all)")
	fs.DurationVar(&cfg.Idle, "idle", 60*time.Second, "idle window after everything settled")
	return job{measure: func(ctx context.Context, env *bench.Env) (printer, error) {
		if cfg.Nodes > 1000 && runtime.NumCPU() < 8 {
			env.Logf("%d nodes on %d CPUs: the simulated control plane (API server, scheduler, kwok), "+
				"not Loom, bounds the rollout and gang timings at this size; the manager's memory and API requests still hold",
				cfg.Nodes, runtime.NumCPU())
		}
		return bench.RunFleet(ctx, env, cfg)
	}}
}

func gpuStack(fs *flag.FlagSet) job {
	cfg := bench.GPUStackConfig{}
	fs.IntVar(&cfg.Nodes, "nodes", 500, "simulated GPU nodes")
	fs.DurationVar(&cfg.Idle, "idle", 60*time.Second, "idle window measured after Ready")
	fs.IntVar(&cfg.ForeignConfigMapsMiB, "foreign-configmaps-mib", 0, "then create this many MiB of ConfigMaps that are not Loom's and report the manager's RSS before and after")
	return job{measure: func(ctx context.Context, env *bench.Env) (printer, error) { return bench.RunGPUStack(ctx, env, cfg) }}
}

func gang(fs *flag.FlagSet) job {
	cfg := bench.GangConfig{}
	fs.IntVar(&cfg.Pods, "pods", 512, "pods in the gang (1 master + pods-1 workers)")
	fs.IntVar(&cfg.Nodes, "nodes", 64, "simulated 8-GPU nodes")
	return job{
		check:   func() error { return cfg.Check() }, // after parsing: not the method value of cfg now
		measure: func(ctx context.Context, env *bench.Env) (printer, error) { return bench.RunGang(ctx, env, cfg) },
	}
}

func rayCluster(fs *flag.FlagSet) job {
	cfg := bench.RayConfig{}
	fs.IntVar(&cfg.Clusters, "clusters", 100, "RayClusters of 1 head + 3 workers")
	fs.DurationVar(&cfg.Idle, "idle", 30*time.Second, "idle window after all are ready")
	return job{measure: func(ctx context.Context, env *bench.Env) (printer, error) { return bench.RunRayClusters(ctx, env, cfg) }}
}

func pending(fs *flag.FlagSet) job {
	cfg := bench.PendingConfig{}
	fs.IntVar(&cfg.Jobs, "jobs", 500, "TrainingJobs of 1 pod × 8 GPUs")
	fs.IntVar(&cfg.Nodes, "nodes", 16, "simulated 8-GPU nodes (as many jobs run, the rest wait)")
	fs.IntVar(&cfg.Finish, "finish", 2, "running jobs the benchmark ends at each step of the churn")
	fs.DurationVar(&cfg.Every, "every", 5*time.Second, "time between two steps of the churn")
	fs.DurationVar(&cfg.Window, "window", 2*time.Minute, "the churn window measured")
	fs.IntVar(&cfg.TenantNodes, "tenant-nodes", 1, "more 8-GPU nodes where another tenant's 1-GPU pods come and go at each step (0: none)")
	return job{
		check:   func() error { return cfg.Check() },
		measure: func(ctx context.Context, env *bench.Env) (printer, error) { return bench.RunPending(ctx, env, cfg) },
	}
}

func compare(fs *flag.FlagSet) job {
	cfg := bench.CompareConfig{}
	fs.IntVar(&cfg.Clusters, "clusters", 100, "raycluster: RayClusters of 1 head + 3 workers")
	fs.IntVar(&cfg.Nodes, "nodes", 0, "raycluster: nodes they run on; 0: as many as RayClusters")
	fs.IntVar(&cfg.GangPods, "gang-pods", 512, "gang: pods of the job (1 master + gang-pods-1 workers, 1 GPU each)")
	fs.IntVar(&cfg.Jobs, "jobs", 20, "jobs: concurrent jobs of 1 master + 7 workers (1 GPU each, on as many 8-GPU nodes); 0: no jobs scenario")
	fs.IntVar(&cfg.Reps, "reps", 3, "repetitions (the contenders' order rotates)")
	fs.DurationVar(&cfg.Idle, "idle", 30*time.Second, "idle window after all RayClusters are ready, and while the gang's and the jobs' pods run")
	fs.BoolVar(&cfg.WarmUp, "warm-up", true, "run the raycluster floor once, unmeasured, before the first repetition")
	fs.StringVar(&cfg.Only, "only", "", "run one scenario only: raycluster, gang or jobs")
	fs.Func("skip", `leave a contender out, its columns "–" (repeatable): Loom, "Loom, all controllers", KubeRay, "Training Operator", floor`, func(v string) error {
		cfg.Skip = append(cfg.Skip, v)
		return nil
	})
	return job{
		check: func() error { return cfg.Check() },
		standalone: func(ctx context.Context, up bench.UpOptions) (printer, error) {
			cfg.Loom, cfg.Logf, cfg.ManagerArgs, cfg.ManagerEnv = up.Loom, up.Logf, up.ManagerArgs, up.ManagerEnv
			return bench.RunCompare(ctx, cfg)
		},
	}
}
