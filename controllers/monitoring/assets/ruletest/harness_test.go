package ruletest

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"sigs.k8s.io/yaml"

	"github.com/loom-dev/loom/controllers/monitoring/assets"
)

// promParser accepts what a Prometheus without feature flags accepts: no
// experimental functions, no extended syntax.
var promParser = parser.NewParser(parser.Options{})

// interval is the rule evaluation interval of the tests (Prometheus's
// default) and the step of the loaded series.
const interval = time.Minute

var start = time.Unix(0, 0).UTC()

// writeRuleFile writes GPURules as a Prometheus rule file: a
// PrometheusRule's spec is the rule file format.
func writeRuleFile(t testing.TB) string {
	t.Helper()
	b, err := yaml.Marshal(assets.GPURules())
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "loom-gpu.yaml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// evaluation is the rule manager's state after evaluating every group, as
// Prometheus does, once per interval over loaded series.
type evaluation struct {
	t      *testing.T
	ll     *promqltest.LazyLoader
	groups []*rules.Group
	at     time.Time
}

// evaluate loads series (promqltest's load syntax, one per line, a sample
// per minute from 0) and evaluates the rules at 0, 1m, ... until.
func evaluate(t *testing.T, series []string, until time.Duration) *evaluation {
	t.Helper()
	ll, err := promqltest.NewLazyLoader("load 1m\n"+strings.Join(series, "\n"), promqltest.LazyLoaderOpts{
		EnableAtModifier: true, EnableNegativeOffset: true, Parser: promParser,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ll.Close() })

	m := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:    rules.EngineQueryFunc(ll.QueryEngine(), ll.Storage()),
		AppendableV2: ll.Storage(),
		Context:      ll.Context(),
		NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
		Logger:       promslog.NewNopLogger(),
		Parser:       promParser,
	})
	file := writeRuleFile(t)
	loaded, errs := m.LoadGroups(interval, labels.EmptyLabels(), "", nil, false, file)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	e := &evaluation{t: t, ll: ll}
	// In the PrometheusRule's order: recordings first, as Prometheus would
	// have them from the previous evaluation anyway.
	for _, g := range assets.GPURules().Groups {
		group := loaded[rules.GroupKey(file, g.Name)]
		if group == nil {
			t.Fatalf("group %s was not loaded", g.Name)
		}
		for _, r := range group.Rules() {
			if a, ok := r.(*rules.AlertingRule); ok {
				// As promtool does: otherwise ALERTS is not written.
				a.SetRestored(true)
			}
		}
		e.groups = append(e.groups, group)
	}
	for ts := start; !ts.After(start.Add(until)); ts = ts.Add(interval) {
		ll.WithSamplesTill(ts, func(err error) {
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range e.groups {
				g.Eval(ll.Context(), ts)
				for _, r := range g.Rules() {
					if err := r.LastError(); err != nil {
						t.Fatalf("%s at %v: %v", r.Name(), ts.Sub(start), err)
					}
				}
			}
		})
		e.at = ts
	}
	return e
}

// firing are the alerts of the named rules (an alert with a rule for
// cordoned nodes has two) that fire at the last evaluation.
func (e *evaluation) firing(name string) []*rules.Alert {
	e.t.Helper()
	var out []*rules.Alert
	found := false
	for _, g := range e.groups {
		for _, r := range g.Rules() {
			a, ok := r.(*rules.AlertingRule)
			if !ok || a.Name() != name {
				continue
			}
			found = true
			for _, alert := range a.ActiveAlerts() {
				if alert.State == rules.StateFiring {
					out = append(out, alert)
				}
			}
		}
	}
	if !found {
		e.t.Fatalf("no alert %s", name)
	}
	return out
}

// query evaluates expr at the last evaluation, over the loaded series and
// what the recording rules wrote.
func (e *evaluation) query(expr string) promql.Vector {
	e.t.Helper()
	q, err := e.ll.QueryEngine().NewInstantQuery(e.ll.Context(), e.ll.Queryable(), nil, expr, e.at)
	if err != nil {
		e.t.Fatalf("%s: %v", expr, err)
	}
	defer q.Close()
	res := q.Exec(e.ll.Context())
	if res.Err != nil {
		e.t.Fatalf("%s: %v", expr, res.Err)
	}
	v, err := res.Vector()
	if err != nil {
		e.t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// Labels of test series, as Loom's ServiceMonitor scrapes dcgm-exporter:
// honorLabels, the target's node, the exporter's own namespace/pod
// dropped, and the workload's namespace/pod/container when a pod has the
// GPU.

const (
	modelName = "NVIDIA H100 80GB HBM3"
	// loomTarget are the target labels of Loom's manager.
	loomTarget = `job="loom-manager", instance="10.0.0.2:8080"`
)

// gpu is one GPU, or one MIG device, as dcgm-exporter labels it.
type gpu struct {
	node  string
	index int
	// extra are more labels: the pod's ("namespace", "team-a", ...), MIG's
	// ("GPU_I_ID", "1", ...) or the Xid's ("err_code", "79", ...).
	extra []string
}

func (g gpu) with(kv ...string) gpu {
	g.extra = append(slices.Clone(g.extra), kv...)
	return g
}

// allocated is g given to a container of the pod namespace/pod.
func (g gpu) allocated(namespace, pod string) gpu {
	return g.with("namespace", namespace, "pod", pod, "container", "main")
}

// mig is MIG instance id of g.
func (g gpu) mig(id int) gpu {
	return g.with("GPU_I_PROFILE", "1g.10gb", "GPU_I_ID", fmt.Sprint(id))
}

// labels are all the labels of g's series but the metric name.
func (g gpu) labels() map[string]string {
	l := map[string]string{
		"job": assets.ExporterJob, "instance": "10.1.0." + g.node[len(g.node)-1:] + ":9400", "node": g.node,
		"Hostname": g.node, "gpu": fmt.Sprint(g.index), "device": fmt.Sprintf("nvidia%d", g.index),
		"UUID": g.uuid(), "modelName": modelName, "pci_bus_id": fmt.Sprintf("00000000:%02X:00.0", 0x18+g.index),
	}
	for i := 0; i+1 < len(g.extra); i += 2 {
		l[g.extra[i]] = g.extra[i+1]
	}
	return l
}

func (g gpu) uuid() string { return fmt.Sprintf("GPU-%s-%d", g.node, g.index) }

// id are the labels naming the physical GPU, those of the hardware alerts.
func (g gpu) id() map[string]string {
	return map[string]string{"node": g.node, "gpu": fmt.Sprint(g.index), "UUID": g.uuid(), "modelName": modelName}
}

// series is the load line of metric for g with values.
func (g gpu) series(metric, values string) string {
	return metric + labelText(g.labels()) + " " + values
}

// upSeries is the up series of node's dcgm-exporter target.
func upSeries(node, values string) string {
	return fmt.Sprintf(`up{job=%q, instance="10.1.0.%s:9400", node=%q, service=%q, endpoint="gpu-metrics"} %s`,
		assets.ExporterJob, node[len(node)-1:], node, assets.ExporterJob, values)
}

// agentSeries is the node agent's last successful collection on node, as
// Loom's PodMonitor scrapes it (the target's node; values in seconds).
func agentSeries(node, values string) string {
	return fmt.Sprintf(`loom_node_agent_last_success_timestamp_seconds{job="loom-system/loom-node-agent", instance="10.1.0.%s:8090", node=%q, pod="loom-node-agent-%s", namespace="loom-system"} %s`,
		node[len(node)-1:], node, node, values)
}

// upgradingSeries is loom_gpunode_driver_upgrade of node (1 while in its
// driver upgrade), as two manager replicas report it.
func upgradingSeries(node, values string) string {
	return loomSeries("loom_gpunode_driver_upgrade", `node="`+node+`"`, values) + "\n" +
		fmt.Sprintf(`loom_gpunode_driver_upgrade{job="loom-manager", instance="10.0.0.3:8080", node=%q} %s`, node, values)
}

// operandSeries is loom_gpunode_operand_not_ready of component on node,
// as two manager replicas report it, from values of its readiness (1
// while its pod there is ready, 0 while none is; "1x2 0x5 1x3"): the
// manager reports only the operands not ready, so that a ready one's
// series ends (a stale marker, as a scrape that no longer has it writes).
func operandSeries(node, component, values string) string {
	var out []string
	notReady := false
	for _, v := range strings.Fields(values) {
		value, times, _ := strings.Cut(v, "x")
		n := 1
		if times != "" {
			n += atoi(times)
		}
		switch value {
		case "0":
			out, notReady = append(out, fmt.Sprintf("1x%d", n-1)), true
		case "1":
			if notReady {
				out, n, notReady = append(out, "stale"), n-1, false
			}
			if n > 0 {
				out = append(out, fmt.Sprintf("_x%d", n))
			}
		default:
			panic("operandSeries takes 0 and 1: " + v)
		}
	}
	labels := fmt.Sprintf(`node=%q, component=%q`, node, component)
	values = strings.Join(out, " ")
	return loomSeries("loom_gpunode_operand_not_ready", labels, values) + "\n" +
		`loom_gpunode_operand_not_ready{job="loom-manager", instance="10.0.0.3:8080", ` + labels + "} " + values
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// cordonedSeries is loom_gpunode_unschedulable of node (1 while cordoned,
// none otherwise: "_x5 1x10 stale"), as two manager replicas report it.
func cordonedSeries(node, values string) string {
	return loomSeries("loom_gpunode_unschedulable", `node="`+node+`"`, values) + "\n" +
		fmt.Sprintf(`loom_gpunode_unschedulable{job="loom-manager", instance="10.0.0.3:8080", node=%q} %s`, node, values)
}

// unprivilegedSeries is loom_gpunode_agent_unprivileged of node (1 while
// its agent runs unprivileged), as two manager replicas report it.
func unprivilegedSeries(node, values string) string {
	return loomSeries("loom_gpunode_agent_unprivileged", `node="`+node+`"`, values) + "\n" +
		fmt.Sprintf(`loom_gpunode_agent_unprivileged{job="loom-manager", instance="10.0.0.3:8080", node=%q} %s`, node, values)
}

// loomSeries is a metric of Loom's manager.
func loomSeries(metric, labels, values string) string {
	if labels != "" {
		labels = ", " + labels
	}
	return metric + "{" + loomTarget + labels + "} " + values
}

// merge returns the union of label maps, later ones winning.
func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}
