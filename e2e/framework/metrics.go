package framework

import (
	"bufio"
	"cmp"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Metrics returns the manager's /metrics text, read with token.
func (m *Manager) Metrics(token string) (string, error) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed
	req, err := http.NewRequest(http.MethodGet, m.MetricsURL, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", m.MetricsURL, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// APIRequest is a verb and resource of loom_api_requests_total.
type APIRequest struct{ Verb, Resource string }

// SortedRequests is every request kind with a count in any of ms, by verb,
// then resource: a benchmark table's rows.
func SortedRequests(ms ...map[APIRequest]float64) []APIRequest {
	seen := map[APIRequest]bool{}
	var out []APIRequest
	for _, m := range ms {
		for k, v := range m {
			if v != 0 && !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	slices.SortFunc(out, func(a, b APIRequest) int {
		return cmp.Or(strings.Compare(a.Verb, b.Verb), strings.Compare(a.Resource, b.Resource))
	})
	return out
}

// APIRequests reads the manager's own request counters
// (loom_api_requests_total) by verb and resource.
func (m *Manager) APIRequests(token string) (map[APIRequest]float64, error) {
	text, err := m.Metrics(token)
	if err != nil {
		return nil, err
	}
	out := map[APIRequest]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "loom_api_requests_total{") {
			continue
		}
		labels, value, _ := strings.Cut(strings.TrimPrefix(line, "loom_api_requests_total{"), "} ")
		var k APIRequest
		for _, kv := range strings.Split(labels, ",") {
			name, v, _ := strings.Cut(kv, "=")
			switch name {
			case "verb":
				k.Verb = strings.Trim(v, `"`)
			case "resource":
				k.Resource = strings.Trim(v, `"`)
			}
		}
		f, _ := strconv.ParseFloat(value, 64)
		out[k] = f
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no loom_api_requests_total on %s", m.MetricsURL)
	}
	return out, nil
}

// MetricSum adds up every sample of the metric called name (any labels) in
// a Prometheus text exposition; false when there is none.
func MetricSum(text, name string) (float64, bool) {
	sum, found := 0.0, false
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

// HTTPMetrics reads a plain-HTTP /metrics endpoint (the node agent's).
func HTTPMetrics(url string) (string, error) {
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
