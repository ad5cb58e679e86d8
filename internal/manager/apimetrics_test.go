package manager

import (
	"net/http"
	"testing"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		method, url, contentType string
		verb, resource           string
	}{
		{"GET", "/api/v1/namespaces/loom-system/pods?watch=true&resourceVersion=1", "", "watch", "pods"},
		{"GET", "/api/v1/pods?limit=500", "", "list", "pods"},
		{"GET", "/api/v1/nodes/n1", "", "get", "nodes"},
		{"PATCH", "/api/v1/nodes/n1?fieldManager=loom", "application/apply-patch+yaml", "apply", "nodes"},
		{"PATCH", "/apis/gpu.loom.dev/v1alpha1/clusterpolicies/default/status", "application/merge-patch+json", "patch", "clusterpolicies/status"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/loom-system/leases/loom-manager", "", "update", "leases"},
		{"POST", "/apis/apps/v1/namespaces/loom-system/daemonsets", "", "create", "daemonsets"},
		{"DELETE", "/apis/apps/v1/namespaces/loom-system/daemonsets/loom-driver", "", "delete", "daemonsets"},
		{"GET", "/api/v1/namespaces", "", "list", "namespaces"},
		{"GET", "/api/v1/namespaces/loom-system", "", "get", "namespaces"},
		{"GET", "/version", "", "get", "nonresource"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, "https://x"+tt.url, nil)
		req.Header.Set("Content-Type", tt.contentType)
		verb, res := Classify(req)
		if verb != tt.verb || res != tt.resource {
			t.Errorf("%s %s = %s %s, want %s %s", tt.method, tt.url, verb, res, tt.verb, tt.resource)
		}
	}
}
