package assets

import (
	_ "embed"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
)

// DCGMMetricsKey ("dcgm-metrics.csv") is the key of the counters ConfigMap
// that dcgm-exporter reads (DCGM_EXPORTER_COLLECTORS points at the mounted
// file): the API's, which the gpu reconciler mounts.
const DCGMMetricsKey = gpuv1alpha1.DCGMCountersKey

// DCGMMetricsCSV is Loom's dcgm-exporter counters file: dcgm-exporter's
// default counters plus the ECC and row-remapping fields the alerts read.
// dcgm-exporter replaces its defaults with this file, so it repeats them.
//
//go:embed dcgm-metrics.csv
var DCGMMetricsCSV string

// Counter types dcgm-exporter accepts in a counters file. A label row adds
// its field's value as a label to every series instead of a series.
const (
	CounterGauge   = "gauge"
	CounterCounter = "counter"
	CounterLabel   = "label"
)

// Counter is one row of a dcgm-exporter counters file.
type Counter struct {
	// Field is the DCGM field name, which is also the metric name.
	Field string
	// Type is CounterGauge, CounterCounter or CounterLabel.
	Type string
	Help string
}

// ParseCounters reads dcgm-exporter's counters format ("DCGM_FI_...,
// gauge|counter|label, help", '#' starts a comment), rejecting what
// dcgm-exporter would refuse to start with: a row without exactly three
// fields, an unknown type, a name that is not a DCGM field, and a field
// listed twice.
func ParseCounters(in string) ([]Counter, error) {
	r := csv.NewReader(strings.NewReader(in))
	r.Comment = '#'
	r.FieldsPerRecord = 3
	r.TrimLeadingSpace = true
	var out []Counter
	seen := map[string]bool{}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		line, _ := r.FieldPos(0)
		c := Counter{Field: strings.TrimSpace(rec[0]), Type: strings.TrimSpace(rec[1]), Help: strings.TrimSpace(rec[2])}
		switch {
		case !strings.HasPrefix(c.Field, "DCGM_FI_") && !strings.HasPrefix(c.Field, "DCGM_EXP_"):
			return nil, fmt.Errorf("line %d: %q is not a DCGM field", line, c.Field)
		case c.Type != CounterGauge && c.Type != CounterCounter && c.Type != CounterLabel:
			return nil, fmt.Errorf("line %d: %s: type %q is none of gauge, counter, label", line, c.Field, c.Type)
		case seen[c.Field]:
			return nil, fmt.Errorf("line %d: %s is listed twice", line, c.Field)
		}
		seen[c.Field] = true
		out = append(out, c)
	}
}

// DCGMMetricNames are the metrics dcgm-exporter exports with
// DCGMMetricsCSV, in file order: its gauge and counter rows (label rows
// become labels, not series).
func DCGMMetricNames() []string {
	counters, err := ParseCounters(DCGMMetricsCSV)
	if err != nil {
		panic("assets: the embedded dcgm-metrics.csv is invalid: " + err.Error())
	}
	var names []string
	for _, c := range counters {
		if c.Type != CounterLabel {
			names = append(names, c.Field)
		}
	}
	return names
}
