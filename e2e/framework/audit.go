package framework

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// auditPolicy logs every write and every get and list at level Metadata
// (who, which verb, which resource; no bodies), once the response is
// complete, and nothing else: watches are long-running and say nothing
// about a program's load, and bodies would make the log the API server's
// main work.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection", "get", "list"]
- level: None
`

// auditFlags writes the audit policy into the cluster directory and
// returns kube-apiserver's flags for it: a JSON-lines log in the cluster
// directory, written before each response is sent (blocking mode), so that
// the log is complete for a window that has ended, and never rotated.
func (c *Cluster) auditFlags() ([]string, error) {
	policy := filepath.Join(c.Dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return nil, err
	}
	c.AuditLog = filepath.Join(c.Dir, "audit.log")
	return []string{"--audit-policy-file", policy, "--audit-log-path", c.AuditLog,
		"--audit-log-format", "json", "--audit-log-mode", "blocking", "--audit-log-maxsize", "0"}, nil
}

// AuditCounts are the API requests of an audit log by program (the user
// agent's part before the first '/': "loom-manager", "kuberay-operator",
// "kube-scheduler"), then by verb and resource. The resource is
// resource[/subresource], or a non-resource request's path ("/apis/ray.io/v1",
// discovery). The verb is the audit log's, but for InformerList.
type AuditCounts map[string]map[APIRequest]float64

// InformerList is the verb counted for a list that names a resourceVersion
// ("?limit=500&resourceVersion=0"): a reflector's list, served from the API
// server's watch cache, that fills the program's own cache, as against a
// live list that goes around it (controller-runtime's client and API reader
// name none).
const InformerList = "informer-list"

// AuditEvent is what the counts keep of one audit event.
type AuditEvent struct {
	Stage, Verb, UserAgent, Namespace string
	Request                           APIRequest
	// Code is the response's status code (0 before ResponseComplete).
	Code int
	// At is when the stage was reached (for ResponseComplete: when the
	// response was done), or, without a stage timestamp, when the request
	// was received.
	At time.Time
}

// auditLine is the part of an audit.k8s.io/v1 Event the counts read.
type auditLine struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	ObjectRef  *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Received time.Time `json:"requestReceivedTimestamp"`
	StageAt  time.Time `json:"stageTimestamp"`
}

// ParseAuditEvent decodes one line of a JSON audit log.
func ParseAuditEvent(line []byte) (AuditEvent, error) {
	var l auditLine
	if err := json.Unmarshal(line, &l); err != nil {
		return AuditEvent{}, err
	}
	ev := AuditEvent{Stage: l.Stage, Verb: l.Verb, UserAgent: l.UserAgent, At: l.StageAt}
	if ev.At.IsZero() {
		ev.At = l.Received
	}
	if l.ResponseStatus != nil {
		ev.Code = l.ResponseStatus.Code
	}
	if l.ObjectRef != nil {
		ev.Namespace = l.ObjectRef.Namespace
	}
	path, query, _ := strings.Cut(l.RequestURI, "?")
	ev.Request.Verb = l.Verb
	if q, err := url.ParseQuery(query); err == nil && l.Verb == "list" && q.Get("resourceVersion") != "" {
		ev.Request.Verb = InformerList
	}
	switch {
	case l.ObjectRef != nil && l.ObjectRef.Resource != "":
		ev.Request.Resource = l.ObjectRef.Resource
		if l.ObjectRef.Subresource != "" {
			ev.Request.Resource += "/" + l.ObjectRef.Subresource
		}
	default:
		ev.Request.Resource = path
	}
	return ev, nil
}

// Program is a user agent's program name: the part before the first '/'
// (client-go's default agent is "binary/version (os/arch) kubernetes/commit").
func Program(userAgent string) string {
	p, _, _ := strings.Cut(userAgent, "/")
	return strings.TrimSpace(p)
}

// CountAudit counts the events of a JSON audit log at stage
// ResponseComplete whose time lies in [from, to) (a zero bound: open). A
// last line without its newline is one the API server is still writing,
// and is left out.
func CountAudit(r io.Reader, from, to time.Time) (AuditCounts, error) {
	out := AuditCounts{}
	br := bufio.NewReaderSize(r, 1<<16)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		ev, err := ParseAuditEvent(line)
		if err != nil {
			return nil, fmt.Errorf("audit log line %d: %w", n, err)
		}
		if ev.Stage != "ResponseComplete" || (!from.IsZero() && ev.At.Before(from)) || (!to.IsZero() && !ev.At.Before(to)) {
			continue
		}
		p := Program(ev.UserAgent)
		if out[p] == nil {
			out[p] = map[APIRequest]float64{}
		}
		out[p][ev.Request]++
	}
}

// Audit counts the cluster's audit log (Options.Audit) in [from, to).
func (c *Cluster) Audit(from, to time.Time) (AuditCounts, error) {
	if c.AuditLog == "" {
		return nil, errors.New("the cluster was started without an audit log (Options.Audit)")
	}
	f, err := os.Open(c.AuditLog)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return CountAudit(f, from, to)
}

// Programs are the programs with requests in the counts, sorted.
func (a AuditCounts) Programs() []string {
	out := make([]string, 0, len(a))
	for p := range a {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Split is the requests of programs (one program's user agents can be
// several: a manager's and its leader election's) in three: their writes
// (every verb the policy logs but get and list), their live reads (get and
// list: around their caches), and their informer lists (filling them).
func (a AuditCounts) Split(programs ...string) (writes, reads, informer map[APIRequest]float64) {
	writes, reads, informer = map[APIRequest]float64{}, map[APIRequest]float64{}, map[APIRequest]float64{}
	for _, p := range programs {
		for k, v := range a[p] {
			switch k.Verb {
			case "get", "list":
				reads[k] += v
			case InformerList:
				informer[k] += v
			case "watch": // not logged by the policy; no read around a cache either
			default:
				writes[k] += v
			}
		}
	}
	return writes, reads, informer
}

// ByCount is every request kind with a count in any of ms, the largest
// count (in any of ms) first, then by resource and verb: a breakdown's rows.
func ByCount(ms ...map[APIRequest]float64) []APIRequest {
	top := map[APIRequest]float64{}
	for _, m := range ms {
		for k, v := range m {
			if v != 0 {
				top[k] = max(top[k], v)
			}
		}
	}
	out := make([]APIRequest, 0, len(top))
	for k := range top {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b APIRequest) int {
		return cmp.Or(cmp.Compare(top[b], top[a]), strings.Compare(a.Resource, b.Resource), strings.Compare(a.Verb, b.Verb))
	})
	return out
}

// LastAudit is the time of the last completed request in the cluster's
// audit log, from from on, that keep accepts (the zero time: none).
func (c *Cluster) LastAudit(from time.Time, keep func(AuditEvent) bool) (time.Time, error) {
	if c.AuditLog == "" {
		return time.Time{}, errors.New("the cluster was started without an audit log (Options.Audit)")
	}
	f, err := os.Open(c.AuditLog)
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	var last time.Time
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for sc.Scan() {
		ev, err := ParseAuditEvent(sc.Bytes())
		if err != nil || ev.Stage != "ResponseComplete" || ev.At.Before(from) || !keep(ev) {
			continue // a line the API server is still writing
		}
		if ev.At.After(last) {
			last = ev.At
		}
	}
	return last, sc.Err()
}
