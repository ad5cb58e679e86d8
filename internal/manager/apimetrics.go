package manager

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// apiRequests counts the manager's own API requests by verb and resource,
// so "an idle cluster costs no writes" can be read off /metrics (the API
// server's apiserver_request_total cannot tell clients apart).
var apiRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "loom_api_requests_total",
	Help: "API requests sent by the manager, by verb (get, list, watch, create, update, patch, apply, delete) and resource.",
}, []string{"verb", "resource"})

func init() { ctrlmetrics.Registry.MustRegister(apiRequests) }

// countRequests wraps cfg's transport with the request counter.
func countRequests(cfg *rest.Config) {
	prev := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return countingTransport{rt}
	}
}

type countingTransport struct{ next http.RoundTripper }

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	verb, resource := Classify(req)
	apiRequests.WithLabelValues(verb, resource).Inc()
	return t.next.RoundTrip(req)
}

// Classify names a request's verb and resource (with /subresource) the way
// the API server's audit log does.
func Classify(req *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return strings.ToLower(req.Method), "nonresource"
	}
	if len(rest) >= 3 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	named := len(rest) >= 2
	if len(rest) >= 1 {
		resource = rest[0]
	}
	if len(rest) >= 3 {
		resource += "/" + rest[2]
	}
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
		if strings.HasPrefix(req.Header.Get("Content-Type"), "application/apply-patch") {
			verb = "apply"
		}
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource
}
