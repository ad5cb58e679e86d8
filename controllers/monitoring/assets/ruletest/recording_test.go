package ruletest

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-dev/loom/controllers/monitoring/assets"
)

const mib = 1 << 20

// const70 is a constant value for 70 minutes.
func const70(v float64) string { return fmt.Sprintf("%gx70", v) }

// busy is a GPU with utilisation util and used of total MiB of framebuffer.
func busy(g gpu, util, used, total float64) []string {
	return []string{
		g.series("DCGM_FI_DEV_GPU_UTIL", const70(util)),
		g.series("DCGM_FI_DEV_FB_USED", const70(used)),
		g.series("DCGM_FI_DEV_FB_FREE", const70(total-used)),
	}
}

// fleet is two nodes: gpu-a with four allocated GPUs (three of TrainingJob
// "train", one of a Deployment's pod), gpu-b with a free GPU and one split
// by MIG, of which one instance is allocated. dcgm-exporter reports
// DCGM_FI_DEV_GPU_UTIL 0 for MIG devices, whatever runs on them (DCGM does
// not measure it per instance): no utilisation figure may count it. A
// second dcgm-exporter (another job) must not count.
func fleet() []string {
	var s []string
	s = append(s, busy(gpuA0.allocated("team-a", "train-master-0"), 80, 1000, 4000)...)
	s = append(s, busy(gpuA1.allocated("team-a", "train-worker-0"), 60, 1000, 4000)...)
	s = append(s, busy(gpu{node: "gpu-a", index: 2}.allocated("team-a", "api-worker-7d9f8"), 10, 1000, 4000)...)
	s = append(s, busy(gpu{node: "gpu-a", index: 3}.allocated("team-a", "train-worker-12"), 40, 1000, 4000)...)
	s = append(s, busy(gpuB0, 0, 0, 4000)...)
	migged := gpu{node: "gpu-b", index: 1}
	s = append(s,
		migged.mig(1).allocated("team-b", "notebook-0").series("DCGM_FI_DEV_FB_USED", const70(500)),
		migged.mig(1).allocated("team-b", "notebook-0").series("DCGM_FI_DEV_FB_FREE", const70(1500)),
		migged.mig(1).allocated("team-b", "notebook-0").series("DCGM_FI_DEV_GPU_UTIL", const70(0)),
		migged.mig(2).series("DCGM_FI_DEV_GPU_UTIL", const70(0)),
		migged.mig(2).series("DCGM_FI_DEV_FB_USED", const70(0)),
		migged.mig(2).series("DCGM_FI_DEV_FB_FREE", const70(2000)),
		migged.series("DCGM_FI_DEV_GPU_TEMP", const70(50)),
		`DCGM_FI_DEV_GPU_UTIL{job="gpu-operator-dcgm-exporter", node="gpu-a", gpu="0", UUID="GPU-gpu-a-0", namespace="team-a", pod="train-master-0"} `+const70(0),
		`DCGM_FI_DEV_FB_USED{job="gpu-operator-dcgm-exporter", node="gpu-a", gpu="0", UUID="GPU-gpu-a-0", namespace="team-a", pod="train-master-0"} `+const70(1000),
	)
	return s
}

func TestRecordingRules(t *testing.T) {
	t.Parallel()
	e := evaluate(t, fleet(), 10*time.Minute)
	want := map[string]map[string]float64{
		assets.RecordNodeGPUUtilization:        {`{node="gpu-a"}`: 47.5, `{node="gpu-b"}`: 0},
		assets.RecordNamespaceGPUUtilization:   {`{namespace="team-a"}`: 47.5},
		assets.RecordTrainingJobGPUUtilization: {`{namespace="team-a", trainingjob="train"}`: 60},
		assets.RecordNamespaceGPUsAllocated:    {`{namespace="team-a"}`: 4, `{namespace="team-b"}`: 1},
		assets.RecordNodeGPUs:                  {`{node="gpu-a"}`: 4, `{node="gpu-b"}`: 2},
		assets.RecordNodeFBUsedBytes:           {`{node="gpu-a"}`: 4000 * mib, `{node="gpu-b"}`: 500 * mib},
		assets.RecordNodeFBTotalBytes:          {`{node="gpu-a"}`: 16000 * mib, `{node="gpu-b"}`: 8000 * mib},
		assets.RecordNamespaceFBUsedBytes:      {`{namespace="team-a"}`: 4000 * mib, `{namespace="team-b"}`: 500 * mib},
	}
	var recorded []string
	for _, g := range assets.GPURules().Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded = append(recorded, r.Record)
			}
		}
	}
	if got := slices.Sorted(maps.Keys(want)); !slices.Equal(got, slices.Sorted(slices.Values(recorded))) {
		t.Errorf("recording rules %v, the test knows %v", recorded, got)
	}
	for name, series := range want {
		got := map[string]float64{}
		for _, s := range e.query(name) {
			l := s.Metric.Map()
			if l["__name__"] != name {
				t.Errorf("%s: series %v", name, s.Metric)
			}
			delete(l, "__name__")
			got[labelText(l)] = s.F
		}
		if !maps.EqualFunc(got, series, func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }) {
			t.Errorf("%s:\n got %v\nwant %v", name, got, series)
		}
	}
}

// labelText is {a="1", b="2"} in name order.
func labelText(l map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, l[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
