package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/loom-dev/loom/e2e/bench"
)

// The fleet benchmark (make bench) at CI size: its table is printed in the
// test log, and it fails only on structural regressions, not on timings:
// any manager write over the idle window apart from the lease, or any read
// that went around the cache (a no-op reconcile reads only from it).
func TestFleetBenchmarkIdleWritesAndReadsNothing(t *testing.T) {
	ctx := context.Background()
	cfg := bench.Config{Nodes: 50, Agents: 2, AgentInterval: 5 * time.Second, GangPods: 64, SmallJobs: 2, RayClusters: 3,
		BackgroundPods: 200, Idle: 45 * time.Second, Prefix: "ci-bench"}
	if err := bench.Prepare(ctx, cluster, &cfg, t.Logf); err != nil {
		t.Fatal(err)
	}
	rel, err := cluster.InstallChart(ctx, "loom", loomNS)
	if err != nil {
		t.Fatal(err)
	}
	r, err := bench.Run(ctx, cluster, loomBin, rel, cfg, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.Print(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("fleet benchmark at CI size (make bench runs 1,000 nodes):\n%s", b.String())
	// .ci/run prints this file, since go test shows a passing test's log
	// only with -v.
	if path := os.Getenv("LOOM_BENCH_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	for k, v := range r.IdleWrites() {
		t.Errorf("idle write: %s %s ×%v", k.Verb, k.Resource, v)
	}
	for k, v := range r.IdleReads() {
		t.Errorf("idle read around the cache: %s %s ×%v", k.Verb, k.Resource, v)
	}
	if r.AgentRuns < 2 {
		t.Errorf("the measured node agents collected %.0f times", r.AgentRuns)
	}
}
