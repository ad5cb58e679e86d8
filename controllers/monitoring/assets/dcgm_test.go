package assets

import (
	"slices"
	"strings"
	"testing"
)

// dcgm-exporter 4.x's default counters (etc/default-counters.csv). Loom's
// file replaces that one, so dropping one of these would silently take a
// metric away from users' own dashboards.
var exporterDefaults = []string{
	"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
	"DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
	"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
	"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
	"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
	"DCGM_FI_DEV_XID_ERRORS",
	"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
	"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
	"DCGM_FI_DEV_VGPU_LICENSE_STATUS",
	"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}

// What Loom adds for its alerts (the upstream file has them commented out
// or not at all).
var loomAdditions = []string{
	"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING",
}

func TestDCGMMetricsCSV(t *testing.T) {
	if DCGMMetricsKey != "dcgm-metrics.csv" {
		t.Errorf("key %q: dcgm-exporter's and GPU Operator's is dcgm-metrics.csv", DCGMMetricsKey)
	}
	counters, err := ParseCounters(DCGMMetricsCSV)
	if err != nil {
		t.Fatal(err)
	}
	names := DCGMMetricNames()
	if len(names) != len(counters) {
		t.Errorf("the file has %d rows but %d metric names (no label rows expected)", len(counters), len(names))
	}
	for _, want := range append(slices.Clone(exporterDefaults), loomAdditions...) {
		if !slices.Contains(names, want) {
			t.Errorf("%s is missing from %s", want, DCGMMetricsKey)
		}
	}
	wantTypes := map[string]string{
		"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": CounterCounter, "DCGM_FI_DEV_ROW_REMAP_PENDING": CounterGauge,
		"DCGM_FI_DEV_XID_ERRORS": CounterGauge, "DCGM_FI_DEV_DEC_UTIL": CounterGauge,
	}
	for _, c := range counters {
		if want, ok := wantTypes[c.Field]; ok && c.Type != want {
			t.Errorf("%s is a %s, want %s", c.Field, c.Type, want)
		}
		if c.Help == "" {
			t.Errorf("%s has no help", c.Field)
		}
	}
}

func TestParseCounters(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    []Counter
		wantErr string
	}{{
		name: "comments, blank lines and padding",
		in: "# Format\n# DCGM FIELD, Prometheus metric type, help message\n\n" +
			"DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).\n" +
			"DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).\n" +
			"# DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, commented out\n" +
			"DCGM_FI_DRIVER_VERSION,        label, Driver Version\n" +
			"DCGM_EXP_XID_ERRORS_COUNT, gauge, Count of XID Errors within the window.",
		want: []Counter{
			{Field: "DCGM_FI_DEV_GPU_TEMP", Type: CounterGauge, Help: "GPU temperature (in C)."},
			{Field: "DCGM_FI_DEV_DEC_UTIL", Type: CounterGauge, Help: "Decoder utilization (in %)."},
			{Field: "DCGM_FI_DRIVER_VERSION", Type: CounterLabel, Help: "Driver Version"},
			{Field: "DCGM_EXP_XID_ERRORS_COUNT", Type: CounterGauge, Help: "Count of XID Errors within the window."},
		},
	}, {
		name: "empty",
		in:   "# nothing\n",
	}, {
		name:    "two fields",
		in:      "DCGM_FI_DEV_GPU_TEMP, gauge\n",
		wantErr: "wrong number of fields",
	}, {
		name:    "a comma in the help",
		in:      "DCGM_FI_DEV_GPU_TEMP, gauge, temperature, in C\n",
		wantErr: "wrong number of fields",
	}, {
		name:    "unknown type",
		in:      "DCGM_FI_DEV_GPU_TEMP, gauge\t, x\nDCGM_FI_DEV_FB_USED, histogramm, x\n",
		wantErr: `line 2: DCGM_FI_DEV_FB_USED: type "histogramm"`,
	}, {
		name:    "not a DCGM field",
		in:      "GPU_TEMP, gauge, x\n",
		wantErr: `"GPU_TEMP" is not a DCGM field`,
	}, {
		name:    "listed twice",
		in:      "DCGM_FI_DEV_GPU_TEMP, gauge, x\n# again\nDCGM_FI_DEV_GPU_TEMP, gauge, y\n",
		wantErr: "line 3: DCGM_FI_DEV_GPU_TEMP is listed twice",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCounters(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
