package bench

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"

	"github.com/loom-dev/loom/e2e/framework"
)

// goal is a product goal on one ratio column's median: at most Max, or at
// least Min.
type goal struct {
	ratio    int // index into the table's ratio pairs
	max, min float64
}

func (g goal) String() string {
	if g.min > 0 {
		return fmt.Sprintf("≥%g×", g.min)
	}
	return fmt.Sprintf("≤%g×", g.max)
}

func (g goal) met(median float64) bool {
	if math.IsNaN(median) {
		return false
	}
	if g.min > 0 {
		return median >= g.min
	}
	return median <= g.max
}

// metric is one row of a comparison table.
type metric struct {
	label string
	get   func(CompareRun) float64
	unit  func(float64) string
	// process: the floor has no process, so no value here.
	process bool
	goals   []goal
	// noRatio leaves the ratio columns empty (a breakdown's rows); note is
	// written into the goal column.
	noRatio bool
	note    string
}

func secs(v float64) string {
	if v < 10 {
		return fmt.Sprintf("%.2f s", v)
	}
	return fmt.Sprintf("%.1f s", v)
}
func mibF(v float64) string { return fmt.Sprintf("%.0f MiB", v/(1<<20)) }
func count(v float64) string {
	if v < 10 && v != math.Trunc(v) {
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}
func percent(v float64) string { return fmt.Sprintf("%.0f%%", 100*v) }
func cpuSecs(v float64) string { return fmt.Sprintf("%.2f s", v) }

// Print writes the comparison as one table, a section a scenario.
func (r *CompareReport) Print(w io.Writer) error {
	t := NewTable(w)
	cfg := r.Config
	t.Row("comparison", "each contender on a fresh simulated cluster (%d CPUs), %d repetition(s), order rotated; median (min–max) over repetitions; ratios paired within a repetition",
		runtime.NumCPU(), cfg.Reps)
	t.Row("writes", "client-go's rest_client_requests_total POST/PUT/PATCH/DELETE, without Loom's lease renewals and its metrics endpoint's reviews of the benchmark's scrapes (the anchors run without leader election, with plain-HTTP metrics)")
	t.Row("audit log", "kube-apiserver's audit log (level Metadata, stage ResponseComplete) over the same window, each contender's requests by its user agent (%s), leases and reviews left out as above: its writes by kind (resource verb), and its reads around its cache (get, and list without a resourceVersion; watches are not logged), apart from its informers' lists (with one)",
		r.agents())
	if len(cfg.ManagerEnv) > 0 || len(cfg.ManagerArgs) > 0 {
		t.Row("Loom's manager run with", "%s", strings.Join(append(append([]string{}, cfg.ManagerEnv...), cfg.ManagerArgs...), " "))
	}
	r.sections(t)
	if idle := r.LoomIdleWrites(); len(idle) > 0 {
		t.Blank()
		for _, k := range framework.SortedRequests(idle) {
			t.Row("Loom idle write (not its lease)", "%s %s: %.0f", k.Verb, k.Resource, idle[k])
		}
	}
	return t.Flush()
}

// sections writes each scenario that ran.
func (r *CompareReport) sections(t *Table) {
	cfg := r.Config
	gangContenders := []string{contLoom, contTO, contFloor}
	gangRatios := [][2]string{{contLoom, contTO}, {contLoom, contFloor}}
	if len(r.Ray) > 0 {
		t.Blank()
		t.Row("raycluster", "%d RayClusters (1 head + 3 workers, %d pods) on %d nodes; Loom's manager with --controllers=raycluster, and with all its controllers (the whole platform, as the chart runs it), vs %s (all its controllers), vs the floor (a plain client, no rate limit, 32 writes in flight, that watches the RayClusters and their pods and sends only what any operator must: each cluster's head Service and pods as KubeRay's builders make them, and one status patch to ready); idle window %s",
			cfg.Clusters, 4*cfg.Clusters, cfg.rayNodes(), r.anchorName(contKubeRay), cfg.Idle)
		// floor/KubeRay is how far below KubeRay this machine lets any
		// operator get: the bound of the Loom/KubeRay goals on time.
		ratios := [][2]string{{contLoom, contKubeRay}, {contLoomAll, contKubeRay}, {contLoom, contFloor}, {contFloor, contKubeRay}}
		r.section(t, r.Ray, rayContenders, ratios, rayMetrics(auditMetrics(r.Ray, rayContenders, "while converging")))
	}
	if len(r.Gang) > 0 {
		t.Blank()
		t.Row("gang", "1 master + %d workers (1 GPU each) on %d 8-GPU nodes; Loom's TrainingJob (--controllers=trainingjob) vs %s's PyTorchJob vs the floor (a plain client creating the same pods, 32 in flight, no rate limit); idle window %s while the job runs",
			cfg.GangPods-1, (cfg.GangPods+7)/8, r.anchorName(contTO), cfg.Idle)
		r.section(t, r.Gang, gangContenders, gangRatios, gangMetrics(cfg.GangPods, true, auditMetrics(r.Gang, gangContenders, "(to the operator's last write + 3 s)")))
	}
	if len(r.Jobs) > 0 {
		pods := cfg.Jobs * jobsPerJob
		t.Blank()
		t.Row("jobs", "%d jobs of 1 master + %d workers (1 GPU each, %d pods) submitted at once on %d 8-GPU nodes; Loom's TrainingJobs (--controllers=trainingjob) vs %s's PyTorchJobs vs the floor (a plain client creating the same pods, 32 in flight, no rate limit); idle window %s while the jobs run; no goals set",
			cfg.Jobs, jobsPerJob-1, pods, (pods+7)/8, r.anchorName(contTO), cfg.Idle)
		r.section(t, r.Jobs, gangContenders, gangRatios, gangMetrics(pods, false, auditMetrics(r.Jobs, gangContenders, "(to the operator's last write + 3 s)")))
	}
}

// agents names each contender's user agents' programs, for the header.
func (r *CompareReport) agents() string {
	var parts []string
	for _, c := range []string{contLoom, contKubeRay, contTO, contFloor} { // contLoomAll's are contLoom's
		parts = append(parts, shortName(c)+": "+strings.Join(r.programs(c), ", "))
	}
	return strings.Join(parts, "; ")
}

func (r *CompareReport) anchorName(c string) string {
	if n := r.AnchorNames[c]; n != "" {
		return n
	}
	return c
}

// rayMetrics are the raycluster section's rows, audit's after the
// client-go writes.
func rayMetrics(audit []metric) []metric {
	ms := []metric{
		{label: "all RayClusters ready", get: func(r CompareRun) float64 { return r.Done.Seconds() }, unit: secs, goals: []goal{{max: 0.6}}},
		{label: "  half of them ready", get: func(r CompareRun) float64 { return r.Half.Seconds() }, unit: secs},
		{label: "  all pods created", get: func(r CompareRun) float64 { return r.Created.Seconds() }, unit: secs},
		{label: "  all pods running (kwok's last start)", get: func(r CompareRun) float64 { return r.Running.Seconds() }, unit: secs},
		{label: "  operator's last write", get: func(r CompareRun) float64 { return r.Quiet.Seconds() }, unit: secs, process: true},
		limiterRow("  "),
		{label: "  machine's CPUs busy to all ready", get: func(r CompareRun) float64 { return r.Busy }, unit: percent, noRatio: true},
		{label: "  kube-apiserver CPU to all ready", get: func(r CompareRun) float64 { return r.Cluster["kube-apiserver"] }, unit: cpuSecs},
		{label: "  etcd CPU to all ready", get: func(r CompareRun) float64 { return r.Cluster["etcd"] }, unit: cpuSecs},
		{label: "  kube-scheduler CPU to all ready", get: func(r CompareRun) float64 { return r.Cluster["kube-scheduler"] }, unit: cpuSecs},
		{label: "  kwok CPU to all ready", get: func(r CompareRun) float64 { return r.Cluster["kwok"] }, unit: cpuSecs},
		{label: "  kube-controller-manager CPU to all ready", get: func(r CompareRun) float64 { return r.Cluster["kube-controller-manager"] }, unit: cpuSecs},
		{label: "peak RSS (VmHWM)", get: func(r CompareRun) float64 { return float64(r.PeakRSS) }, unit: mibF, process: true, goals: []goal{{max: 0.75}, {ratio: 1, max: 1.25}}},
		{label: "settled RSS (VmRSS)", get: func(r CompareRun) float64 { return float64(r.RSS) }, unit: mibF, process: true},
		{label: "  of it RssAnon", get: func(r CompareRun) float64 { return float64(r.AnonRSS) }, unit: mibF, process: true},
		{label: "  of it RssFile (binary's pages)", get: func(r CompareRun) float64 { return float64(r.FileRSS) }, unit: mibF, process: true},
		{label: "CPU while converging", get: func(r CompareRun) float64 { return r.CPU }, unit: cpuSecs, process: true},
		{label: "CPU per idle minute", get: func(r CompareRun) float64 { return r.IdleCPU }, unit: cpuSecs, process: true},
		{label: "API server + etcd CPU while converging", get: func(r CompareRun) float64 { return r.ControlPlaneCPU }, unit: cpuSecs},
		{label: "writes while converging", get: func(r CompareRun) float64 { return r.Writes }, unit: count, goals: []goal{{max: 0.55}}},
	}
	ms = append(ms, audit...)
	return append(ms, metric{label: "writes per idle minute", get: func(r CompareRun) float64 { return r.IdleWrites }, unit: count, process: true})
}

// limiterRow is the row of the time the operator's requests waited for its own
// client rate limiter, summed over them ("–" where its metrics do not say):
// near 0, the operator did not throttle itself, and its time is its work's
// and the cluster's.
func limiterRow(indent string) metric {
	return metric{label: indent + "operator's requests' wait for its client rate limiter (sum)",
		get: func(r CompareRun) float64 { return r.LimiterWait }, unit: waitSecs, process: true, noRatio: true}
}

// waitSecs is a rate limiter's summed wait: milliseconds show.
func waitSecs(v float64) string { return fmt.Sprintf("%.3f s", v) }

// gangMetrics are a gang-like section's rows for pods pods, audit's after
// the client-go writes; the goals are the gang scenario's.
func gangMetrics(pods int, goals bool, audit []metric) []metric {
	n := float64(pods)
	ms := []metric{
		{label: "all pods created", get: func(r CompareRun) float64 { return r.Done.Seconds() }, unit: secs, goals: []goal{{ratio: 1, max: 1.3}}},
		{label: "pods/s created", get: func(r CompareRun) float64 { return n / r.Done.Seconds() }, unit: count, goals: []goal{{min: 10}}},
		{label: "all pods running", get: func(r CompareRun) float64 { return r.Running.Seconds() }, unit: secs},
		{label: "operator's last write", get: func(r CompareRun) float64 { return r.Quiet.Seconds() }, unit: secs, process: true},
		limiterRow(""),
		{label: "API server + etcd CPU", get: func(r CompareRun) float64 { return r.ControlPlaneCPU }, unit: cpuSecs},
		{label: "writes (to the operator's last write + 3 s)", get: func(r CompareRun) float64 { return r.Writes }, unit: count, goals: []goal{{max: 0.55}}},
	}
	ms = append(ms, audit...)
	ms = append(ms,
		metric{label: "peak RSS (VmHWM)", get: func(r CompareRun) float64 { return float64(r.PeakRSS) }, unit: mibF, process: true},
		metric{label: "settled RSS (VmRSS, after the idle window)", get: func(r CompareRun) float64 { return float64(r.RSS) }, unit: mibF, process: true},
		metric{label: "  of it RssAnon", get: func(r CompareRun) float64 { return float64(r.AnonRSS) }, unit: mibF, process: true},
		metric{label: "  of it RssFile (binary's pages)", get: func(r CompareRun) float64 { return float64(r.FileRSS) }, unit: mibF, process: true},
		metric{label: "CPU (to the operator's last write + 3 s)", get: func(r CompareRun) float64 { return r.CPU }, unit: cpuSecs, process: true},
		metric{label: "CPU per idle minute (the jobs running)", get: func(r CompareRun) float64 { return r.IdleCPU }, unit: cpuSecs, process: true},
		metric{label: "writes per idle minute (the jobs running)", get: func(r CompareRun) float64 { return r.IdleWrites }, unit: count, process: true})
	if !goals {
		for i := range ms {
			ms[i].goals = nil
		}
	}
	return ms
}

// auditMetrics are the rows of the audit log's figures over phase: each
// contender's writes, in all (set against client-go's figure) and by kind,
// then its reads around its cache, in all and by kind.
func auditMetrics(runs map[string][]CompareRun, contenders []string, phase string) []metric {
	writes := func(r CompareRun) map[framework.APIRequest]float64 { return r.AuditWrites }
	reads := func(r CompareRun) map[framework.APIRequest]float64 { return r.AuditReads }
	ms := []metric{{label: "  audit log: writes " + phase, get: func(r CompareRun) float64 { return total(r.AuditWrites) },
		unit: count, note: agreement(runs, contenders)}}
	ms = append(ms, kindRows(runs, writes)...)
	ms = append(ms, metric{label: "reads around the cache " + phase, get: func(r CompareRun) float64 { return total(r.AuditReads) }, unit: count})
	ms = append(ms, kindRows(runs, reads)...)
	return append(ms, metric{label: "  informer lists (filling its cache, not around it)",
		get: func(r CompareRun) float64 { return total(r.AuditInformer) }, unit: count, noRatio: true})
}

// kindRows are one row a request kind in any run's of(run), the largest
// first.
func kindRows(runs map[string][]CompareRun, of func(CompareRun) map[framework.APIRequest]float64) []metric {
	var all []map[framework.APIRequest]float64
	for _, rs := range runs {
		for _, run := range rs {
			all = append(all, of(run))
		}
	}
	var ms []metric
	for _, k := range framework.ByCount(all...) {
		ms = append(ms, metric{label: "    " + k.Resource + " " + k.Verb, get: func(r CompareRun) float64 { return of(r)[k] }, unit: count, noRatio: true})
	}
	return ms
}

// agreement says whether the audit log's writes are client-go's in every
// run, naming each run where they differ (both figures stay in the table).
func agreement(runs map[string][]CompareRun, contenders []string) string {
	var diffs []string
	for _, c := range contenders {
		for i, run := range runs[c] {
			if a := total(run.AuditWrites); a != run.Writes {
				diffs = append(diffs, fmt.Sprintf("%s rep %d: audit %.0f vs client-go %.0f", shortName(c), i+1, a, run.Writes))
			}
		}
	}
	if len(diffs) == 0 {
		return "= client-go's figure in every run"
	}
	return "≠ client-go's figure: " + strings.Join(diffs, "; ")
}

// section writes one scenario: a column per contender, a column per ratio,
// and the goals with whether the median ratio meets them.
func (r *CompareReport) section(t *Table, runs map[string][]CompareRun, contenders []string, ratios [][2]string, metrics []metric) {
	header := []string{""}
	for _, c := range contenders {
		header = append(header, r.anchorName(c))
	}
	for _, p := range ratios {
		header = append(header, shortName(p[0])+"/"+shortName(p[1]))
	}
	t.Cells(append(header, "goal")...)
	for _, m := range metrics {
		vals := map[string][]float64{}
		row := []string{m.label}
		for _, c := range contenders {
			for _, run := range runs[c] {
				v := m.get(run)
				if m.process && c == contFloor {
					v = math.NaN()
				}
				vals[c] = append(vals[c], v)
			}
			row = append(row, spread(vals[c], m.unit))
		}
		medians := make([]float64, len(ratios))
		for i, p := range ratios {
			if m.noRatio {
				row = append(row, "")
				continue
			}
			rs := pairRatios(vals[p[0]], vals[p[1]])
			medians[i] = median(rs)
			row = append(row, spread(rs, func(v float64) string { return fmt.Sprintf("%.2f×", v) }))
		}
		var gs []string
		for _, g := range m.goals {
			verdict := "not met"
			switch pair := ratios[g.ratio]; {
			case len(runs[pair[0]]) == 0 || len(runs[pair[1]]) == 0:
				verdict = "not run"
			case g.met(medians[g.ratio]):
				verdict = "met"
			}
			gs = append(gs, fmt.Sprintf("%s/%s %s: %s", shortName(ratios[g.ratio][0]), shortName(ratios[g.ratio][1]), g, verdict))
		}
		if m.note != "" {
			gs = append(gs, m.note)
		}
		t.Cells(append(row, strings.Join(gs, "; "))...)
	}
}

func shortName(c string) string {
	switch c {
	case contTO:
		return "TO"
	case contLoomAll:
		return "Loom all"
	}
	return c
}

// pairRatios are a[i]/b[i], a repetition's contenders paired.
func pairRatios(a, b []float64) []float64 {
	out := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]/b[i])
	}
	return out
}

// spread is "median (min–max)", or the one value, or "–" without values.
func spread(vs []float64, unit func(float64) string) string {
	var ok []float64
	for _, v := range vs {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			ok = append(ok, v)
		}
	}
	switch {
	case len(ok) == 0:
		return "–"
	case len(ok) == 1 || slices.Min(ok) == slices.Max(ok):
		return unit(ok[0])
	}
	return fmt.Sprintf("%s (%s–%s)", unit(median(ok)), unit(slices.Min(ok)), unit(slices.Max(ok)))
}

// median of vs, NaN without values or with any NaN.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if math.IsNaN(s[0]) {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// LoomIdleWrites are Loom's idle writes apart from its lease, over every
// run of Loom's (the whole platform's included): the comparison's
// structural check.
func (r *CompareReport) LoomIdleWrites() map[framework.APIRequest]float64 {
	out := map[framework.APIRequest]float64{}
	runs := slices.Concat(r.Ray[contLoom], r.Ray[contLoomAll], r.Gang[contLoom], r.Jobs[contLoom])
	for _, run := range runs {
		for k, v := range run.LoomIdle {
			out[k] += v
		}
	}
	return out
}
