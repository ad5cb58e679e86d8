package ruletest

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/loom-dev/loom/controllers/monitoring/assets"
)

// Metrics the rules and dashboards may read besides dcgm-exporter's (the
// CSV) and the recording rules.
var (
	// loomMetrics are exported by Loom's manager and node agent;
	// TestLoomMetricsExist finds each in Loom's source.
	loomMetrics = []string{
		"loom_gpunode_gpus", "loom_gpunode_unhealthy_gpus", "loom_gpunode_ready", "loom_gpunode_driver_upgrade", "loom_gpunode_operand_not_ready", "loom_gpunode_node_ready", "loom_gpunode_unschedulable", "loom_gpunode_agent_unprivileged",
		"loom_node_agent_last_success_timestamp_seconds",
		"loom_clusterpolicy_ready", "loom_clusterpolicy_component_desired_nodes", "loom_clusterpolicy_component_ready_nodes",
		"loom_trainingjobs", "loom_driver_upgrade_nodes",
	}
	// rayMetrics are Ray's system metrics as docs.ray.io lists them
	// (ray-observability/reference/system-metrics): per node
	// ray_node_cpu_utilization (%), ray_node_mem_used (bytes),
	// ray_node_gpus_utilization (%, GpuIndex, GpuDeviceName),
	// ray_node_gram_used (documented as bytes, reported in MiB, which Ray's
	// own dashboards multiply by 1024²); ray_tasks and ray_actors by State.
	rayMetrics = []string{
		"ray_node_gpus_utilization", "ray_node_gram_used", "ray_node_cpu_utilization", "ray_node_mem_used",
		"ray_tasks", "ray_actors",
	}
	// prometheusMetrics are Prometheus's own, per target.
	prometheusMetrics = []string{"up"}
)

func recordNames() []string {
	var out []string
	for _, g := range assets.GPURules().Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out = append(out, r.Record)
			}
		}
	}
	return out
}

// selectors parses expr as a default Prometheus would and returns its
// vector selectors.
func selectors(t *testing.T, expr string) []*parser.VectorSelector {
	t.Helper()
	e, err := promParser.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s:\n%v", expr, err)
		return nil
	}
	var out []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

// checkSelectors fails on a metric outside known, a selector without a
// metric name (which would escape the check), a dcgm-exporter series not
// limited to Loom's exporter, and a utilisation series (DCGM_FI_DEV_*_UTIL)
// that reads MIG devices: DCGM measures none per MIG device, and
// dcgm-exporter reports 0 however busy the device is.
func checkSelectors(t *testing.T, where, expr string, known []string) {
	t.Helper()
	for _, vs := range selectors(t, expr) {
		switch {
		case vs.Name == "":
			t.Errorf("%s: %s has no metric name", where, vs)
		case !slices.Contains(known, vs.Name):
			t.Errorf("%s: %s is not a metric Loom knows", where, vs.Name)
		case strings.HasPrefix(vs.Name, "DCGM_") || vs.Name == "up":
			if !slices.ContainsFunc(vs.LabelMatchers, func(m *labels.Matcher) bool {
				return m.Name == "job" && m.Type == labels.MatchEqual && m.Value == assets.ExporterJob
			}) {
				t.Errorf("%s: %s reads every job, not only %s", where, vs, assets.ExporterJob)
			}
			if strings.HasPrefix(vs.Name, "DCGM_FI_DEV_") && strings.HasSuffix(vs.Name, "_UTIL") &&
				!slices.ContainsFunc(vs.LabelMatchers, func(m *labels.Matcher) bool {
					return m.Name == "GPU_I_ID" && m.Type == labels.MatchEqual && m.Value == ""
				}) {
				t.Errorf("%s: %s reads MIG devices, whose utilisation dcgm-exporter reports as 0", where, vs)
			}
		}
	}
}

// The rules read only dcgm-exporter's metrics (those of the CSV), Loom's,
// up and their own recordings; every expression parses.
func TestRuleMetrics(t *testing.T) {
	known := slices.Concat(assets.DCGMMetricNames(), loomMetrics, prometheusMetrics, recordNames())
	for _, g := range assets.GPURules().Groups {
		for _, r := range g.Rules {
			checkSelectors(t, r.Alert+r.Record, r.Expr.String(), known)
		}
	}
}

// dashboardQueries are the queries of a dashboard: its targets and, for its
// variables, the selectors inside label_values(selector, label).
type dashboardQuery struct {
	where, expr string
	// label is a variable's label; "" for a target.
	label string
}

func dashboardQueries(t *testing.T, text string) []dashboardQuery {
	t.Helper()
	var d struct {
		Templating struct {
			List []struct{ Name, Type, Query string } `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(text), &d); err != nil {
		t.Fatal(err)
	}
	labelValues := regexp.MustCompile(`^label_values\((.+), (\w+)\)$`)
	var out []dashboardQuery
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Query)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, v.Query)
			continue
		}
		out = append(out, dashboardQuery{where: "variable " + v.Name, expr: m[1], label: m[2]})
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, dashboardQuery{where: p.Title, expr: tg.Expr})
		}
	}
	return out
}

// dashboardValues are what the viewer picks in each dashboard's variables,
// chosen to match the series of dashboardFleet; "All" is the variable's
// allValue.
var dashboardValues = map[string]map[string]string{
	assets.FleetDashboard:    {"node": ".*", "namespace": ".+"},
	assets.WorkloadDashboard: {"namespace": "team-a", "trainingjob": "train", "raycluster": "rc"},
}

// grafanaVariables are what Grafana puts in every query.
var grafanaVariables = map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "datasource": "prometheus"}

// interpolate replaces $name and ${name} as Grafana does.
func interpolate(t *testing.T, expr string, values map[string]string) string {
	t.Helper()
	return regexp.MustCompile(`\$\{?([A-Za-z_]\w*)\}?`).ReplaceAllStringFunc(expr, func(ref string) string {
		name := strings.Trim(ref, "${}")
		if v, ok := values[name]; ok {
			return v
		}
		if v, ok := grafanaVariables[name]; ok {
			return v
		}
		t.Errorf("%s: $%s has no value", expr, name)
		return ref
	})
}

// Every dashboard query parses and reads only metrics Loom knows.
func TestDashboardMetrics(t *testing.T) {
	known := slices.Concat(assets.DCGMMetricNames(), loomMetrics, rayMetrics, recordNames())
	for file, text := range assets.Dashboards() {
		for _, q := range dashboardQueries(t, text) {
			checkSelectors(t, file+": "+q.where, interpolate(t, q.expr, dashboardValues[file]), known)
		}
	}
}

// Every recording rule is read by an alert or a dashboard.
func TestRecordingRulesAreRead(t *testing.T) {
	var read []string
	for _, g := range assets.GPURules().Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				for _, vs := range selectors(t, r.Expr.String()) {
					read = append(read, vs.Name)
				}
			}
		}
	}
	for file, text := range assets.Dashboards() {
		for _, q := range dashboardQueries(t, text) {
			for _, vs := range selectors(t, interpolate(t, q.expr, dashboardValues[file])) {
				read = append(read, vs.Name)
			}
		}
	}
	for _, name := range recordNames() {
		if !slices.Contains(read, name) {
			t.Errorf("nothing reads %s", name)
		}
	}
}

// dashboardFleet has a series for every panel: fleet's GPUs, hardware
// errors on one, an idle allocated GPU, a Ray cluster "rc" of two pods in
// team-a, and Loom's own metrics.
func dashboardFleet() []string {
	s := fleet()
	s = append(s, busy(gpu{node: "gpu-c", index: 0}.allocated("team-c", "idle-0"), 0, 0, 4000)...)
	rayWorker := gpu{node: "gpu-c", index: 1}.allocated("team-a", "rc-gpu-worker-ab12c")
	s = append(s, busy(rayWorker, 40, 2000, 4000)...)
	a0 := gpuA0.allocated("team-a", "train-master-0")
	s = append(s,
		a0.series("DCGM_FI_DEV_GPU_TEMP", const70(60)),
		a0.series("DCGM_FI_DEV_POWER_USAGE", const70(300)),
		a0.series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "0+2x70"),
		a0.series("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "0+1x70"),
		a0.series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0+1x70"),
		a0.series("DCGM_FI_DEV_ROW_REMAP_PENDING", const70(1)),
		a0.series("DCGM_FI_DEV_ROW_REMAP_FAILURE", const70(1)),
		a0.series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", const70(2)),
		a0.series("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", const70(3)),
		a0.with("err_code", "13", "err_msg", "Graphics Engine Exception").series("DCGM_FI_DEV_XID_ERRORS", const70(13)),
	)
	for _, g := range []gpu{gpuA1.allocated("team-a", "train-worker-0"), gpu{node: "gpu-a", index: 3}.allocated("team-a", "train-worker-12")} {
		s = append(s, g.series("DCGM_FI_DEV_POWER_USAGE", const70(250)),
			g.with("err_code", "31", "err_msg", "GPU memory page fault").series("DCGM_FI_DEV_XID_ERRORS", const70(31)))
	}
	ray := `namespace="team-a", ray_io_cluster="rc", ray_io_node_type="worker", ray_io_group="gpu", job="team-a/loom-raycluster-rc", `
	rayHead := `namespace="team-a", ray_io_cluster="rc", ray_io_node_type="head", job="team-a/loom-raycluster-rc", pod="rc-head-x7k2p"`
	s = append(s,
		`ray_node_gpus_utilization{`+ray+`pod="rc-gpu-worker-ab12c", GpuIndex="0", GpuDeviceName="`+modelName+`"} `+const70(40),
		`ray_node_gram_used{`+ray+`pod="rc-gpu-worker-ab12c", GpuIndex="0", GpuDeviceName="`+modelName+`"} `+const70(2000),
		`ray_node_cpu_utilization{`+ray+`pod="rc-gpu-worker-ab12c"} `+const70(30),
		`ray_node_cpu_utilization{`+rayHead+`} `+const70(5),
		`ray_node_mem_used{`+rayHead+`} `+const70(4e9),
		`ray_node_mem_used{`+ray+`pod="rc-gpu-worker-ab12c"} `+const70(8e9),
		`ray_tasks{`+rayHead+`, State="RUNNING", Name="train_fn", IsRetry="0"} `+const70(3),
		`ray_actors{`+rayHead+`, State="ALIVE", Name="Trainer"} `+const70(2),
		// A cluster whose name starts like rc's.
		`ray_node_cpu_utilization{namespace="team-a", ray_io_cluster="rc-2", pod="rc-2-head-qwert"} `+const70(5),
	)
	for _, node := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		s = append(s,
			upSeries(node, const70(1)),
			loomSeries("loom_gpunode_gpus", `node="`+node+`", product="NVIDIA-H100-80GB-HBM3"`, const70(3)),
			loomSeries("loom_gpunode_unhealthy_gpus", `node="`+node+`"`, const70(0)),
			loomSeries("loom_gpunode_ready", `node="`+node+`"`, const70(1)),
		)
	}
	s = append(s,
		loomSeries("loom_clusterpolicy_ready", `policy="default"`, const70(1)),
		loomSeries("loom_clusterpolicy_component_desired_nodes", `component="dcgm-exporter"`, const70(3)),
		loomSeries("loom_clusterpolicy_component_ready_nodes", `component="dcgm-exporter"`, const70(3)),
		loomSeries("loom_driver_upgrade_nodes", `state="in_progress"`, const70(0)),
		loomSeries("loom_driver_upgrade_nodes", `state="failed"`, const70(0)),
		loomSeries("loom_trainingjobs", `state="Running"`, const70(1)),
		loomSeries("loom_trainingjobs", `state="Failed"`, const70(0)),
	)
	return s
}

// Every panel and variable of the dashboards finds its series: the label
// matching (the TrainingJob's and the Ray cluster's pods, ray_io_cluster,
// the recording rules' labels) is right.
func TestDashboardQueriesFindSeries(t *testing.T) {
	t.Parallel()
	e := evaluate(t, dashboardFleet(), 70*time.Minute)
	for file, text := range assets.Dashboards() {
		for _, q := range dashboardQueries(t, text) {
			expr := interpolate(t, q.expr, dashboardValues[file])
			res := e.query(expr)
			if len(res) == 0 {
				t.Errorf("%s: %s: %s finds nothing", file, q.where, expr)
				continue
			}
			if q.label == "" {
				continue
			}
			var values []string
			for _, s := range res {
				if v := s.Metric.Get(q.label); v != "" && !slices.Contains(values, v) {
					values = append(values, v)
				}
			}
			// The workload dashboard's choices must be among the values.
			if want, ok := dashboardValues[file][strings.TrimPrefix(q.where, "variable ")]; ok && file == assets.WorkloadDashboard {
				slices.Sort(values)
				if !slices.Contains(values, want) {
					t.Errorf("%s: %s lists %v, not %s", file, q.where, values, want)
				}
			}
		}
	}

	// The workload's panels show its pods, all of them and only them.
	want := map[string][]string{
		"$trainingjob": {"train-master-0", "train-worker-0", "train-worker-12"},
		"$raycluster":  {"rc-gpu-worker-ab12c", "rc-head-x7k2p"},
	}
	for _, q := range dashboardQueries(t, assets.Dashboards()[assets.WorkloadDashboard]) {
		for ref, pods := range want {
			if q.label != "" || !strings.Contains(q.expr, ref) {
				continue
			}
			var got []string
			for _, s := range e.query(interpolate(t, q.expr, dashboardValues[assets.WorkloadDashboard])) {
				if pod := s.Metric.Get("pod"); pod != "" && !slices.Contains(got, pod) {
					got = append(got, pod)
				}
			}
			slices.Sort(got)
			// Ray's CPU-only head has no GPU series.
			gpuPodsOnly := ref == "$raycluster" && slices.Equal(got, pods[:1])
			if len(got) > 0 && !slices.Equal(got, pods) && !gpuPodsOnly {
				t.Errorf("%s shows pods %v, want %v", q.where, got, pods)
			}
		}
	}
}

// Ray's GPU utilisation panel leaves out MIG devices, which NVML measures
// no utilisation of: Ray reports -1 for each of a pod's MIG devices or,
// before Ray read MIG devices, 0 for the GPU split, however busy.
func TestRayGPUUtilizationLeavesOutMIG(t *testing.T) {
	t.Parallel()
	ray := `namespace="team-a", ray_io_cluster="rc", ray_io_node_type="worker", ray_io_group="gpu", job="team-a/loom-raycluster-rc", `
	util := func(pod, index, values string) string {
		return `ray_node_gpus_utilization{` + ray + `pod="` + pod + `", GpuIndex="` + index + `"} ` + values
	}
	series := []string{
		util("rc-gpu-worker-full1", "0", const70(40)),
		gpu{node: "gpu-a", index: 0}.allocated("team-a", "rc-gpu-worker-full1").series("DCGM_FI_DEV_FB_USED", const70(2000)),
		util("rc-gpu-worker-mig01", "1001", const70(-1)),
		gpu{node: "gpu-b", index: 1}.mig(1).allocated("team-a", "rc-gpu-worker-mig01").series("DCGM_FI_DEV_FB_USED", const70(500)),
		util("rc-gpu-worker-mig02", "1", const70(0)),
		gpu{node: "gpu-b", index: 1}.mig(2).allocated("team-a", "rc-gpu-worker-mig02").series("DCGM_FI_DEV_FB_USED", const70(500)),
	}
	e := evaluate(t, series, 70*time.Minute)
	var found bool
	for _, q := range dashboardQueries(t, assets.Dashboards()[assets.WorkloadDashboard]) {
		if q.where != "GPU utilisation (Ray)" {
			continue
		}
		found = true
		var got []string
		for _, s := range e.query(interpolate(t, q.expr, dashboardValues[assets.WorkloadDashboard])) {
			got = append(got, s.Metric.Get("pod"))
		}
		if !slices.Equal(got, []string{"rc-gpu-worker-full1"}) {
			t.Errorf("%s shows %v, want only the pod of a whole GPU", q.where, got)
		}
	}
	if !found {
		t.Fatal("no panel GPU utilisation (Ray)")
	}
}

// Loom's source defines each loom_* metric the rules and dashboards read,
// so renaming one there breaks this test rather than the alerts.
func TestLoomMetricsExist(t *testing.T) {
	root := filepath.Join("..", "..", "..", "..")
	var source strings.Builder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "assets" || d.Name() == ".git" || d.Name() == "e2e" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			source.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range loomMetrics {
		if !strings.Contains(source.String(), `"`+name+`"`) {
			t.Errorf("no Go file of Loom defines %s", name)
		}
	}
}
