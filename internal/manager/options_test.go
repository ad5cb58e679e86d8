package manager

import (
	"flag"
	"io"
	"reflect"
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
