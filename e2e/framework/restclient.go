package framework

import (
	"strconv"
	"strings"
)

// Samples are the samples of the metric called name in a Prometheus text
// exposition: each one's labels and value. Label values hold no commas or
// quotes in the metrics read here (methods, codes, hosts, resources).
func Samples(text, name string) []Sample {
	var out []Sample
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			continue
		}
		s := Sample{Labels: map[string]string{}, Value: v}
		for _, kv := range strings.Split(labels, ",") {
			k, lv, _ := strings.Cut(kv, "=")
			s.Labels[k] = strings.Trim(lv, `"`)
		}
		out = append(out, s)
	}
	return out
}

// Sample is one sample of a metric.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// RESTClientWrites adds up client-go's rest_client_requests_total{method}
// for POST, PUT, PATCH and DELETE: every write a client-go program sent,
// whatever it wrote (any controller-runtime program exposes the metric).
func RESTClientWrites(text string) float64 {
	n := 0.0
	for _, s := range Samples(text, "rest_client_requests_total") {
		switch s.Labels["method"] {
		case "POST", "PUT", "PATCH", "DELETE":
			n += s.Value
		}
	}
	return n
}

// ParseAPIRequests is loom_api_requests_total by verb and resource in a
// /metrics text: Loom's own count of the requests client-go counts too.
func ParseAPIRequests(text string) map[APIRequest]float64 {
	out := map[APIRequest]float64{}
	for _, s := range Samples(text, "loom_api_requests_total") {
		out[APIRequest{Verb: s.Labels["verb"], Resource: s.Labels["resource"]}] += s.Value
	}
	return out
}
