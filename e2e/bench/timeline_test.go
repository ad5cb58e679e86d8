package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loom-dev/loom/e2e/framework"
)

// auditLine is one ResponseComplete line as kube-apiserver's JSON log
// backend writes it at level Metadata, at start+at.
func auditLine(start time.Time, at time.Duration, verb, agent, resource, sub, ns string, code int) string {
	ts := start.Add(at).UTC().Format(time.RFC3339Nano)
	return fmt.Sprintf(`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/x","verb":%q,`+
		`"userAgent":%q,"objectRef":{"resource":%q,"subresource":%q,"namespace":%q},"responseStatus":{"code":%d},`+
		`"requestReceivedTimestamp":%q,"stageTimestamp":%q}`, verb, agent, resource, sub, ns, code, ts, ts)
}

func auditCluster(t *testing.T, lines ...string) *framework.Cluster {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &framework.Cluster{AuditLog: path}
}

const (
	kwokAgent = "kwok/v0.8.0 (linux/amd64) kubernetes/$Format"
	loomAgent = "loom-manager/v0.0.0"
)

// The pods' timeline counts the namespace's successful pod creates, by
// anyone, and kwok's successful status patches, nothing else.
func TestPodsTimeline(t *testing.T) {
	start := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	s := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	c := auditCluster(t,
		auditLine(start, -s(1), "create", loomAgent, "pods", "", "bench", 201),         // before the start
		auditLine(start, s(1), "create", loomAgent, "pods", "", "bench", 201),          // created
		auditLine(start, s(2.5), "create", floorAgent+"/v0", "pods", "", "bench", 201), // the last created
		auditLine(start, s(3), "patch", kwokAgent, "pods", "status", "bench", 200),     // the last start
		auditLine(start, s(4), "create", loomAgent, "pods", "", "bench", 409),          // refused
		auditLine(start, s(5), "create", loomAgent, "pods", "", "other", 201),          // another namespace
		auditLine(start, s(6), "patch", kwokAgent, "pods", "status", "bench", 422),     // kwok's refused replay
		auditLine(start, s(7), "patch", loomAgent, "pods", "status", "bench", 200),     // not kwok
		auditLine(start, s(8), "patch", kwokAgent, "pods", "status", "other", 200),     // another namespace
	)
	var run CompareRun
	if err := podsTimeline(c, &run, "bench", start); err != nil {
		t.Fatal(err)
	}
	if run.Created != s(2.5) || run.Running != s(3) {
		t.Errorf("created %v, running %v; want 2.5s, 3s", run.Created, run.Running)
	}
	// None at all: zero, no error.
	run = CompareRun{}
	if err := podsTimeline(auditCluster(t, auditLine(start, s(1), "create", loomAgent, "services", "", "bench", 201)), &run, "bench", start); err != nil ||
		run.Created != 0 || run.Running != 0 {
		t.Errorf("no pods: created %v, running %v, err %v", run.Created, run.Running, err)
	}
}

// The operator's last write is its programs' last write: not a read, an
// informer's list, a lease, a metrics review, or another program's write.
func TestLastWrite(t *testing.T) {
	start := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	c := auditCluster(t,
		auditLine(start, time.Second, "create", loomAgent, "pods", "", "bench", 201),
		auditLine(start, 2*time.Second, "patch", loomAgent, "rayclusters", "status", "bench", 200), // the last write
		auditLine(start, 3*time.Second, "get", loomAgent, "rayclusters", "", "bench", 200),
		auditLine(start, 4*time.Second, "update", loomAgent, "leases", "", "loom-system", 200),
		auditLine(start, 5*time.Second, "create", loomAgent, "tokenreviews", "", "", 201),
		auditLine(start, 6*time.Second, "create", loomAgent, "subjectaccessreviews", "", "", 201),
		auditLine(start, 7*time.Second, "create", "kuberay-operator/v1.5.0", "pods", "", "bench", 201),
	)
	got, err := lastWrite(c, []string{"loom-manager", "loom"}, start)
	if err != nil {
		t.Fatal(err)
	}
	if want := start.Add(2 * time.Second); !got.Equal(want) {
		t.Errorf("last write at %v, want %v", got.Sub(start), want.Sub(start))
	}
	if got, err := lastWrite(c, []string{"ray-operator"}, start); err != nil || !got.IsZero() {
		t.Errorf("a program without writes: %v, %v; want the zero time", got, err)
	}
}
