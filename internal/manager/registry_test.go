package manager

import (
	"context"
	"math"
	"strings"
	"testing"

	ctrl "sigs.k8s.io/controller-runtime"
)

func noop(context.Context, ctrl.Manager, Options) error { return nil }

func TestRegistrySelect(t *testing.T) {
	reg := &Registry{}
	reg.Add("training", noop)
	reg.Add("gpu", noop)
	reg.Add("raycluster", noop)

	tests := []struct {
		spec    string
		want    string
		wantErr string
	}{
		{spec: "", want: "gpu,raycluster,training"},
		{spec: "all", want: "gpu,raycluster,training"},
		{spec: "*", want: "gpu,raycluster,training"},
		{spec: "training", want: "training"},
		{spec: " training , gpu,training,", want: "gpu,training"},
		{spec: "bogus", wantErr: `unknown controller(s) "bogus" in --controllers; valid names: gpu, raycluster, training`},
		{spec: "gpu,bogus,nope", wantErr: `"bogus", "nope"`},
	}
	for _, tt := range tests {
		got, err := reg.Select(tt.spec)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Select(%q) error = %v, want it to contain %q", tt.spec, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("Select(%q): %v", tt.spec, err)
			continue
		}
		if strings.Join(got, ",") != tt.want {
			t.Errorf("Select(%q) = %v, want %s", tt.spec, got, tt.want)
		}
	}
}

func TestRegistryEmpty(t *testing.T) {
	_, err := (&Registry{}).Select("gpu")
	if err == nil || !strings.Contains(err.Error(), "no controllers are built into this binary") {
		t.Fatalf("error = %v", err)
	}
}

func TestRegistryAddTwicePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("second Add of the same name did not panic")
		}
	}()
	reg := &Registry{}
	reg.Add("gpu", noop)
	reg.Add("gpu", noop)
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Options)
		wantErr string
	}{
		{name: "defaults", mutate: func(*Options) {}},
		{name: "zero concurrency", mutate: func(o *Options) { o.MaxConcurrentReconciles = 0 }, wantErr: "--max-concurrent-reconciles"},
		{name: "zero qps", mutate: func(o *Options) { o.KubeAPIQPS = 0 }, wantErr: "--kube-api-qps"},
		{name: "NaN qps", mutate: func(o *Options) { o.KubeAPIQPS = math.NaN() }, wantErr: "--kube-api-qps must be positive, got NaN"},
		{name: "unlimited qps", mutate: func(o *Options) { o.KubeAPIQPS = math.Inf(1) }},
		{name: "zero burst", mutate: func(o *Options) { o.KubeAPIBurst = 0 }, wantErr: "--kube-api-burst"},
		{name: "bad log level", mutate: func(o *Options) { o.LogLevel = "loud" }, wantErr: "--log-level"},
		{name: "bad log format", mutate: func(o *Options) { o.LogFormat = "xml" }, wantErr: "--log-format"},
		{name: "lease timings", mutate: func(o *Options) { o.RenewDeadline = o.LeaseDuration }, wantErr: "lease-duration > renew-deadline"},
		{name: "no lease name", mutate: func(o *Options) { o.LeaderElectionID = "" }, wantErr: "--leader-election-id"},
		{name: "no lease name without election", mutate: func(o *Options) { o.LeaderElect = false; o.LeaderElectionID = "" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Namespace = "loom-system"
			tt.mutate(&o)
			err := o.Validate()
			if tt.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error = %v, want it to mention %q", err, tt.wantErr)
			}
		})
	}
}

func TestParseLogLevel(t *testing.T) {
	for in, want := range map[string]int8{"debug": -1, "info": 0, "error": 2, "3": -3, "0": 0} {
		got, err := ParseLogLevel(in)
		if err != nil || int8(got) != want {
			t.Errorf("ParseLogLevel(%q) = %v, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"-1", "x", "1.5"} {
		if _, err := ParseLogLevel(in); err == nil {
			t.Errorf("ParseLogLevel(%q) accepted", in)
		}
	}
}
