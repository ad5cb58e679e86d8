package e2e

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-dev/loom/e2e/bench"
)

// The comparison (make bench) at CI size: Loom's manager against KubeRay
// v1.5.0 and the floor on 5 RayClusters and against the Training Operator
// v1.8.1 and the floor on a 1 + 31 gang and on 2 concurrent 1 + 7 jobs, one repetition,
// each on a fresh cluster of its own. Its table is printed in the test
// log. On a shared 2-core machine the timings and ratios are noise at this
// size, so it fails only on hard errors (an anchor that does not start, a
// contender that does not converge) and on a write of Loom's manager (Ray
// controller alone, the whole platform, or the TrainingJob controller while
// its jobs run) in the idle window other than its lease. Each run's writes
// and reads by kind, from the API server's audit log, are logged too.
func TestCompareWithKubeRayAndTrainingOperator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// With make bench's warm-up (the floor once, unmeasured), so that it runs
	// in CI too.
	cfg := bench.CompareConfig{Clusters: 5, GangPods: 32, Jobs: 2, Reps: 1, Idle: 20 * time.Second, WarmUp: true, Loom: loomBin, Logf: t.Logf}
	r, err := bench.RunCompare(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.Print(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("comparison at CI size (make bench runs 100 RayClusters, a 512-pod gang, 20 jobs, 3 repetitions):\n%s", b.String())
	if path := os.Getenv("LOOM_COMPARE_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Errorf("writing the table to %s: %v", path, err)
		}
	}
	for _, sc := range []struct {
		name string
		runs map[string][]bench.CompareRun
	}{{"raycluster", r.Ray}, {"gang", r.Gang}, {"jobs", r.Jobs}} {
		for _, name := range slices.Sorted(maps.Keys(sc.runs)) {
			for i, run := range sc.runs[name] {
				t.Logf("%s, %s, rep %d, from the audit log: writes %s; reads around the cache %s",
					sc.name, name, i+1, run.WritesByKind(), run.ReadsByKind())
			}
		}
	}
	// Every contender's RayClusters have a pods' timeline from the audit
	// log, and the last pod started after the last was created.
	for name, runs := range r.Ray {
		for i, run := range runs {
			if run.Created <= 0 || run.Running < run.Created {
				t.Errorf("raycluster, %s, rep %d: last pod created %v, last started %v", name, i+1, run.Created, run.Running)
			}
		}
	}
	for k, v := range r.LoomIdleWrites() {
		t.Errorf("Loom idle write (not its lease): %s %s ×%v", k.Verb, k.Resource, v)
	}
}
