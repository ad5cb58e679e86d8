package assets

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The shape of every rule. The expressions themselves are parsed and
// evaluated in ruletest/, a module of its own because Prometheus would
// raise this module's client_golang.
func TestGPURulesShape(t *testing.T) {
	recordName := regexp.MustCompile(`^[a-z_]+:[a-z_]+:[a-z]+$`)
	groups, alerts, records, cordoned := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, g := range GPURules().Groups {
		if g.Name == "" || groups[g.Name] {
			t.Errorf("group name %q is empty or repeated", g.Name)
		}
		groups[g.Name] = true
		if len(g.Rules) == 0 {
			t.Errorf("group %s has no rules", g.Name)
		}
		for _, r := range g.Rules {
			if strings.TrimSpace(r.Expr.String()) == "" {
				t.Errorf("%s%s has no expression", r.Alert, r.Record)
			}
			if r.For != nil {
				if _, err := time.ParseDuration(string(*r.For)); err != nil {
					t.Errorf("%s: for: %v", r.Alert, err)
				}
			}
			switch {
			case r.Record != "" && r.Alert != "":
				t.Errorf("%s is both a recording and an alerting rule", r.Record)
			case r.Record != "":
				if !recordName.MatchString(r.Record) || records[r.Record] {
					t.Errorf("recording rule %q is not named level:metric:operation, or repeated", r.Record)
				}
				records[r.Record] = true
				if r.For != nil || len(r.Annotations) > 0 {
					t.Errorf("recording rule %s has for or annotations", r.Record)
				}
			case r.Alert != "":
				// Repeated only as its rule for cordoned nodes, right after.
				if !strings.HasPrefix(r.Alert, "LoomGPU") || alerts[r.Alert] && (r.Labels[LabelCordoned] != "true" || cordoned[r.Alert]) {
					t.Errorf("alert %q is not named LoomGPU..., or repeated", r.Alert)
				}
				cordoned[r.Alert] = r.Labels[LabelCordoned] == "true"
				alerts[r.Alert] = true
				switch r.Labels["severity"] {
				case SeverityCritical, SeverityWarning, SeverityInfo:
				default:
					t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
				}
				for _, key := range []string{"summary", "description", "runbook"} {
					if strings.TrimSpace(r.Annotations[key]) == "" {
						t.Errorf("%s has no %s", r.Alert, key)
					}
				}
				if len(r.Annotations) != 3 {
					t.Errorf("%s: annotations %v, want summary, description and runbook only", r.Alert, r.Annotations)
				}
				if strings.Contains(r.Annotations["runbook"], "://") {
					t.Errorf("%s: the runbook is a note, not a URL", r.Alert)
				}
			default:
				t.Errorf("a rule of %s is neither recording nor alerting", g.Name)
			}
		}
	}
	for _, name := range []string{
		RecordNodeGPUUtilization, RecordNamespaceGPUUtilization, RecordTrainingJobGPUUtilization,
		RecordNamespaceGPUsAllocated, RecordNodeGPUs, RecordNodeFBUsedBytes, RecordNodeFBTotalBytes, RecordNamespaceFBUsedBytes,
	} {
		if !records[name] {
			t.Errorf("no recording rule %s", name)
		}
	}
	if len(alerts) < 15 {
		t.Errorf("%d alerts, want at least 15", len(alerts))
	}
}

// The Xids that need a reset are critical, and only they.
func TestCriticalXids(t *testing.T) {
	for _, code := range []int{48, 63, 64, 74, 79, 92, 94, 95} {
		if !slices.Contains(criticalXids, code) {
			t.Errorf("Xid %d is not critical", code)
		}
	}
	for _, code := range []int{13, 31, 43, 45} {
		if slices.Contains(criticalXids, code) {
			t.Errorf("Xid %d (the application's) is critical", code)
		}
	}
}
