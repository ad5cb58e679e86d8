package manager

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
)

// --kueue-label-keys-to-copy takes a comma list of label keys, as Kueue's
// integrations.labelKeysToCopy, and refuses a key that is not one.
func TestKueueLabelKeysToCopyFlag(t *testing.T) {
	tests := []struct {
		arg     string
		want    []string
		wantErr bool
	}{
		{"team", []string{"team"}, false},
		{" team , example.com/cost-center ,", []string{"team", "example.com/cost-center"}, false},
		{"", nil, false},
		{"team,bad key", nil, true},
		{"-team", nil, true},
	}
	for _, tt := range tests {
		o := DefaultOptions()
		fs := flag.NewFlagSet("loom", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.BindFlags(fs)
		err := fs.Parse([]string{"--kueue-label-keys-to-copy=" + tt.arg})
		if (err != nil) != tt.wantErr {
			t.Errorf("%q: error %v, want one: %v", tt.arg, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && !reflect.DeepEqual(o.KueueLabelKeysToCopy, tt.want) {
			t.Errorf("%q: keys %q, want %q", tt.arg, o.KueueLabelKeysToCopy, tt.want)
		}
	}
}

// The chart's default arguments for the manager's own ServiceMonitor parse
// and validate; a Service that cannot be one, or an interval Prometheus
// cannot read, is refused at start.
func TestMetricsServiceMonitorFlags(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr bool
	}{
		{[]string{"--metrics-service-monitor=loom-metrics", "--metrics-scrape-interval=30s", "--metrics-service-monitor-labels=release=kps"}, false},
		{[]string{"--metrics-service-monitor=loom-metrics", "--metrics-scrape-interval=1m30s"}, false},
		{[]string{"--metrics-service-monitor=Loom_Metrics"}, true},
		{[]string{"--metrics-service-monitor=loom-metrics", "--metrics-scrape-interval=30"}, true},
		{[]string{"--metrics-service-monitor-labels=bad key=x"}, true},
	}
	for _, tt := range tests {
		o := DefaultOptions()
		o.Namespace = "loom-system"
		fs := flag.NewFlagSet("loom", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.BindFlags(fs)
		err := fs.Parse(tt.args)
		if err == nil {
			err = o.Validate()
		}
		if (err != nil) != tt.wantErr {
			t.Errorf("%q: error %v, want one: %v", tt.args, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && (o.MetricsServiceMonitor != "loom-metrics" || o.MetricsScrapeInterval == "") {
			t.Errorf("%q: options %q %q", tt.args, o.MetricsServiceMonitor, o.MetricsScrapeInterval)
		}
	}
	o := DefaultOptions()
	fs := flag.NewFlagSet("loom", flag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse([]string{"--metrics-service-monitor-labels=release=kps,team=gpu"}); err != nil ||
		!reflect.DeepEqual(o.MetricsServiceMonitorLabels, map[string]string{"release": "kps", "team": "gpu"}) {
		t.Errorf("labels %v (%v)", o.MetricsServiceMonitorLabels, err)
	}
}

// A namespace or Lease name no object can have is refused at start, naming
// the flag, instead of a manager that watches or writes nothing there, or
// never takes its lease.
func TestOptionsRefuseNamesNoObjectHas(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--watch-namespaces=team-a,ml", "--grafana-dashboards-namespace=monitoring", "--leader-election-namespace=kube-system",
			"--leader-election-id=loom.example.com"}, ""},
		{[]string{"--watch-namespaces=team-a,Team_B"}, `--watch-namespaces: "Team_B" is no namespace's name`},
		{[]string{"--watch-namespaces=*"}, `--watch-namespaces: "*" is no namespace's name`},
		{[]string{"--namespace=loom system"}, `--namespace: "loom system" is no namespace's name`},
		{[]string{"--grafana-dashboards-namespace=Monitoring"}, `--grafana-dashboards-namespace: "Monitoring"`},
		{[]string{"--leader-election-namespace=kube.system"}, `--leader-election-namespace: "kube.system"`},
		{[]string{"--leader-election-id=Loom_Lease"}, `--leader-election-id: "Loom_Lease" is no Lease's name`},
		{[]string{"--leader-election-id=Loom_Lease", "--leader-elect=false"}, ""},
	}
	for _, tt := range tests {
		o := DefaultOptions()
		o.Namespace = "loom-system"
		fs := flag.NewFlagSet("loom", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.BindFlags(fs)
		err := fs.Parse(tt.args)
		if err == nil {
			err = o.Validate()
		}
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%q: error %v, want %q", tt.args, err, tt.wantErr)
		}
	}
}
