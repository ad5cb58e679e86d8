package bench

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
)

// fixed is a contender whose metrics are one text.
type fixed string

func (fixed) PID() int                   { return os.Getpid() }
func (fixed) halt()                      {}
func (f fixed) metrics() (string, error) { return string(f), nil }

// The rate limiter's wait is the difference of its sums over the window,
// for a contender that exposes it, and "–" in the table for one that does
// not (the anchors) and for the floor.
func TestLimiterWait(t *testing.T) {
	const writes = `rest_client_requests_total{code="201",host="h",method="POST"} 5` + "\n"
	limiter := func(sum float64) string {
		return fmt.Sprintf("rest_client_rate_limiter_duration_seconds_bucket{host=\"h\",verb=\"POST\",le=\"0.005\"} 3\n"+
			"rest_client_rate_limiter_duration_seconds_sum{host=\"h\",verb=\"POST\"} %g\n"+
			"rest_client_rate_limiter_duration_seconds_count{host=\"h\",verb=\"POST\"} 5\n"+
			"rest_client_rate_limiter_duration_seconds_sum{host=\"h\",verb=\"GET\"} 0.5\n", sum)
	}
	run := func(before, after string) CompareRun {
		t.Helper()
		s0, err := takeSample(fixed(before))
		if err != nil {
			t.Fatal(err)
		}
		s1, err := takeSample(fixed(after))
		if err != nil {
			t.Fatal(err)
		}
		var r CompareRun
		r.converged(s0, s1)
		return r
	}
	loom := run(writes+limiter(0.25), writes+limiter(1.5))
	if loom.LimiterWait != 1.25 {
		t.Errorf("Loom's wait %g s, want 1.25 s", loom.LimiterWait)
	}
	anchor := run(writes, writes)
	if !math.IsNaN(anchor.LimiterWait) {
		t.Errorf("an anchor without the metric waited %g s, want NaN", anchor.LimiterWait)
	}

	r := &CompareReport{Config: CompareConfig{Reps: 1, Clusters: 1, Idle: 1}, AnchorNames: map[string]string{},
		Ray: map[string][]CompareRun{contLoom: {loom}, contKubeRay: {anchor}, contFloor: {{}}}}
	var out bytes.Buffer
	if err := r.Print(&out); err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "client rate limiter") {
			row = line
		}
	}
	if row == "" {
		t.Fatalf("no rate-limiter row in\n%s", out.String())
	}
	// Loom, Loom all (no run), KubeRay, floor.
	cells := strings.Fields(strings.SplitN(row, "(sum)", 2)[1])
	want := []string{"1.250", "s", "–", "–", "–"}
	if strings.Join(cells, " ") != strings.Join(want, " ") {
		t.Errorf("row %q: cells %q, want %q", row, cells, want)
	}
}
