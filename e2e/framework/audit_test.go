package framework

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// auditEvent is one line as kube-apiserver's JSON log backend writes it
// at level Metadata (trimmed of fields the counts do not read).
func auditEvent(stage, verb, agent, objectRef, uri, received, done string) string {
	ref := ""
	if objectRef != "" {
		ref = `"objectRef":` + objectRef + `,`
	}
	return fmt.Sprintf(`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0f3c","stage":%q,"requestURI":%q,"verb":%q,`+
		`"user":{"username":"admin","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":%q,%s`+
		`"responseStatus":{"metadata":{},"code":201},"requestReceivedTimestamp":%q,"stageTimestamp":%q}`,
		stage, uri, verb, agent, ref, received, done)
}

const (
	kuberayAgent = "kuberay-operator/v1.5.0"
	loomAgent    = "loom-manager/leader-election"
	toAgent      = "training-operator.v1/v0.0.0 (linux/amd64) kubernetes/$Format"
)

func TestParseAuditEvent(t *testing.T) {
	at := time.Date(2025, 5, 1, 10, 0, 0, 123456000, time.UTC)
	tests := []struct {
		name, line string
		want       AuditEvent
	}{{
		name: "a create",
		line: auditEvent("ResponseComplete", "create", kuberayAgent, `{"resource":"pods","namespace":"bench","apiVersion":"v1"}`,
			"/api/v1/namespaces/bench/pods", "2025-05-01T10:00:00.100000Z", "2025-05-01T10:00:00.123456Z"),
		want: AuditEvent{Stage: "ResponseComplete", Verb: "create", UserAgent: kuberayAgent, Request: APIRequest{Verb: "create", Resource: "pods"}, At: at},
	}, {
		name: "a status patch: resource/subresource",
		line: auditEvent("ResponseComplete", "patch", loomAgent, `{"resource":"rayclusters","namespace":"bench","name":"rc-0","apiGroup":"ray.io","apiVersion":"v1","subresource":"status"}`,
			"/apis/ray.io/v1/namespaces/bench/rayclusters/rc-0/status?fieldManager=loom", "2025-05-01T10:00:00.100000Z", "2025-05-01T10:00:00.123456Z"),
		want: AuditEvent{Stage: "ResponseComplete", Verb: "patch", UserAgent: loomAgent, Request: APIRequest{Verb: "patch", Resource: "rayclusters/status"}, At: at},
	}, {
		name: "discovery: the path without the query",
		line: auditEvent("ResponseComplete", "get", toAgent, "", "/apis/kubeflow.org/v1?timeout=32s", "2025-05-01T10:00:00.100000Z", "2025-05-01T10:00:00.123456Z"),
		want: AuditEvent{Stage: "ResponseComplete", Verb: "get", UserAgent: toAgent, Request: APIRequest{Verb: "get", Resource: "/apis/kubeflow.org/v1"}, At: at},
	}, {
		name: "a reflector's list (a resourceVersion): an informer list",
		line: auditEvent("ResponseComplete", "list", kuberayAgent, `{"resource":"rayjobs","apiGroup":"ray.io","apiVersion":"v1"}`,
			"/apis/ray.io/v1/rayjobs?limit=500&resourceVersion=0", "2025-05-01T10:00:00.100000Z", "2025-05-01T10:00:00.123456Z"),
		want: AuditEvent{Stage: "ResponseComplete", Verb: "list", UserAgent: kuberayAgent, Request: APIRequest{Verb: InformerList, Resource: "rayjobs"}, At: at},
	}, {
		name: "a live list: no resourceVersion",
		line: auditEvent("ResponseComplete", "list", kuberayAgent, `{"resource":"pods","namespace":"bench","apiVersion":"v1"}`,
			"/api/v1/namespaces/bench/pods?labelSelector=a%3Db&resourceVersion=", "2025-05-01T10:00:00.100000Z", "2025-05-01T10:00:00.123456Z"),
		want: AuditEvent{Stage: "ResponseComplete", Verb: "list", UserAgent: kuberayAgent, Request: APIRequest{Verb: "list", Resource: "pods"}, At: at},
	}, {
		name: "a get naming a resourceVersion stays a get",
		line: auditEvent("ResponseComplete", "get", kuberayAgent, `{"resource":"pods","namespace":"bench","name":"p","apiVersion":"v1"}`,
			"/api/v1/namespaces/bench/pods/p?resourceVersion=0", "2025-05-01T10:00:00.100000Z", "2025-05-01T10:00:00.123456Z"),
		want: AuditEvent{Stage: "ResponseComplete", Verb: "get", UserAgent: kuberayAgent, Request: APIRequest{Verb: "get", Resource: "pods"}, At: at},
	}, {
		name: "no stage timestamp: when received",
		line: `{"stage":"ResponseComplete","verb":"list","userAgent":"x","objectRef":{"resource":"nodes"},"requestReceivedTimestamp":"2025-05-01T10:00:00.123456Z"}`,
		want: AuditEvent{Stage: "ResponseComplete", Verb: "list", UserAgent: "x", Request: APIRequest{Verb: "list", Resource: "nodes"}, At: at},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAuditEvent([]byte(tt.line))
			if err != nil {
				t.Fatal(err)
			}
			if !got.At.Equal(tt.want.At) {
				t.Errorf("At = %s, want %s", got.At, tt.want.At)
			}
			got.At = tt.want.At
			if got.Code != 0 && got.Code != 201 {
				t.Errorf("Code = %d, want the fixture's 201", got.Code)
			}
			got.Code, got.Namespace = 0, "" // checked below
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	ev, err := ParseAuditEvent([]byte(auditEvent("ResponseComplete", "create", kuberayAgent, `{"resource":"pods","namespace":"bench"}`,
		"/api/v1/namespaces/bench/pods", "2025-05-01T10:00:00.100000Z", "2025-05-01T10:00:00.123456Z")))
	if err != nil || ev.Namespace != "bench" || ev.Code != 201 {
		t.Errorf("a create's namespace and code: %+v, %v", ev, err)
	}
	if _, err := ParseAuditEvent([]byte(`{"stage":`)); err == nil {
		t.Error("a broken line parsed")
	}
}

func TestProgram(t *testing.T) {
	for ua, want := range map[string]string{
		kuberayAgent:   "kuberay-operator",
		loomAgent:      "loom-manager",
		"loom-manager": "loom-manager",
		toAgent:        "training-operator.v1",
		"kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/abc/system:serviceaccount:kube-system:replicaset-controller": "kube-controller-manager",
		"": "",
	} {
		if got := Program(ua); got != want {
			t.Errorf("Program(%q) = %q, want %q", ua, got, want)
		}
	}
}

func TestCountAudit(t *testing.T) {
	ts := func(s int) string { return time.Date(2025, 5, 1, 10, 0, s, 0, time.UTC).Format(time.RFC3339Nano) }
	pods := `{"resource":"pods","namespace":"bench"}`
	log := strings.Join([]string{
		auditEvent("ResponseComplete", "create", kuberayAgent, pods, "/api/v1/namespaces/bench/pods", ts(0), ts(1)), // before the window
		auditEvent("ResponseComplete", "create", kuberayAgent, pods, "/api/v1/namespaces/bench/pods", ts(1), ts(2)), // from: in
		auditEvent("ResponseComplete", "create", kuberayAgent, pods, "/api/v1/namespaces/bench/pods", ts(2), ts(3)), // in
		auditEvent("ResponseStarted", "create", kuberayAgent, pods, "/api/v1/namespaces/bench/pods", ts(2), ts(3)),  // not complete
		auditEvent("ResponseComplete", "list", kuberayAgent, pods, "/api/v1/namespaces/bench/pods", ts(2), ts(3)),   // a read
		auditEvent("ResponseComplete", "update", loomAgent, `{"resource":"leases"}`, "/apis/coordination", ts(3), ts(3)),
		auditEvent("ResponseComplete", "create", "loom-manager", pods, "/api/v1/namespaces/bench/pods", ts(4), ts(4)), // to: out
	}, "\n") + "\n" + `{"stage":"ResponseComplete","verb":"cre` // being written
	got, err := CountAudit(strings.NewReader(log), time.Date(2025, 5, 1, 10, 0, 2, 0, time.UTC), time.Date(2025, 5, 1, 10, 0, 4, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	want := AuditCounts{
		"kuberay-operator": {{Verb: "create", Resource: "pods"}: 2, {Verb: "list", Resource: "pods"}: 1},
		"loom-manager":     {{Verb: "update", Resource: "leases"}: 1},
	}
	if !equalAudit(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	all, err := CountAudit(strings.NewReader(log), time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if n := all["kuberay-operator"][APIRequest{Verb: "create", Resource: "pods"}]; n != 3 {
		t.Errorf("open window: %v kuberay pod creates, want 3", n)
	}
	if _, err := CountAudit(strings.NewReader("{}\nnot json\n"), time.Time{}, time.Time{}); err == nil {
		t.Error("a broken complete line counted")
	}
}

func equalAudit(a, b AuditCounts) bool {
	return maps.EqualFunc(a, b, func(x, y map[APIRequest]float64) bool { return maps.Equal(x, y) })
}

func TestSplitAndByCount(t *testing.T) {
	a := AuditCounts{"loom-manager": {
		{Verb: "create", Resource: "pods"}: 400, {Verb: "create", Resource: "services"}: 100,
		{Verb: "patch", Resource: "rayclusters/status"}: 100, {Verb: "create", Resource: "events"}: 101,
		{Verb: "get", Resource: "secrets"}: 2, {Verb: "list", Resource: "pods"}: 1, {Verb: "watch", Resource: "pods"}: 3,
		{Verb: InformerList, Resource: "pods"}: 1,
	}, "loom": {{Verb: "update", Resource: "leases"}: 5, {Verb: "get", Resource: "leases"}: 1}, "kube-scheduler": {{Verb: "create", Resource: "pods/binding"}: 400}}
	writes, reads, informer := a.Split("loom-manager", "loom")
	wantWrites := map[APIRequest]float64{{Verb: "create", Resource: "pods"}: 400, {Verb: "create", Resource: "services"}: 100,
		{Verb: "patch", Resource: "rayclusters/status"}: 100, {Verb: "create", Resource: "events"}: 101, {Verb: "update", Resource: "leases"}: 5}
	wantReads := map[APIRequest]float64{{Verb: "get", Resource: "secrets"}: 2, {Verb: "list", Resource: "pods"}: 1, {Verb: "get", Resource: "leases"}: 1}
	if !maps.Equal(writes, wantWrites) || !maps.Equal(reads, wantReads) || !maps.Equal(informer, map[APIRequest]float64{{Verb: InformerList, Resource: "pods"}: 1}) {
		t.Fatalf("writes %v, reads %v, informer lists %v", writes, reads, informer)
	}
	if w, r, i := a.Split("nobody"); len(w)+len(r)+len(i) != 0 {
		t.Errorf("nobody's requests: %v %v %v", w, r, i)
	}
	var got []string
	for _, k := range ByCount(writes, map[APIRequest]float64{{Verb: "delete", Resource: "pods"}: 150, {Verb: "update", Resource: "x"}: 0}) {
		got = append(got, k.Resource+" "+k.Verb)
	}
	// By the largest count in any of the maps, ties by resource; no zero.
	want := []string{"pods create", "pods delete", "events create", "rayclusters/status patch", "services create", "leases update"}
	if !slices.Equal(got, want) {
		t.Errorf("ByCount = %v, want %v", got, want)
	}
	if got := a.Programs(); !slices.Equal(got, []string{"kube-scheduler", "loom", "loom-manager"}) {
		t.Errorf("Programs = %v", got)
	}
}
