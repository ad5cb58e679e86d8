package why

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// constants are the string constants a package's non-test files declare,
// by name, read from its source (this package may not import a controller).
func constants(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range parseDir(t, dir) {
		{
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, s := range g.Specs {
					vs := s.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
								out[n.Name], _ = strconv.Unquote(lit.Value)
							}
						}
					}
				}
			}
		}
	}
	return out
}

// TestReasonsAreTheReconcilers holds the reasons, condition types and
// labels the plugin explains equal to the constants the reconcilers set.
func TestReasonsAreTheReconcilers(t *testing.T) {
	cases := []struct {
		dir  string
		want map[string]string // the reconciler's constant name -> ours
	}{
		{"controllers/training", map[string]string{
			"ReasonCreateFailed": ReasonCreateFailed, "ReasonVolcanoNotInstalled": ReasonVolcanoNotInstalled,
			"ReasonGangPending": ReasonGangPending, "ReasonGangInqueue": ReasonGangInqueue, "ReasonPodsPending": ReasonPodsPending,
			"ReasonNeverFits": ReasonNeverFits, "ReasonNotEnoughGPUs": ReasonNotEnoughGPUs, "ReasonWaitingForPods": ReasonWaitingForPods,
			"ReasonRetryableFailure": ReasonRetryableFailure, "ReasonPermanentFailure": ReasonPermanentFailure,
			"ReasonBackoffLimit": ReasonBackoffLimit, "ReasonDeadlineExceeded": ReasonDeadlineExceeded, "ReasonSuspended": ReasonSuspended,
			"ReasonTooManyPods": ReasonTooManyPods, "ReasonNameConflict": ReasonNameConflict,
			"ReasonWorkloadDeactivated": ReasonWorkloadDeactivated, "ReasonQueueNameMissing": ReasonQueueNameMissing,
			"ReasonQueuedInKueue": ReasonQueuedInKueue, "ReasonEvictedByKueue": ReasonEvictedByKueue, "ReasonInvalidSpec": ReasonInvalidSpec,
		}},
		{"internal/gang", map[string]string{"ReasonQueueNotFound": ReasonQueueNotFound, "ReasonQueueClosed": ReasonQueueClosed}},
		{"controllers/clusterpolicy", map[string]string{
			"ReasonComponentsWait": ReasonComponentsWait, "ReasonNoGPUNodes": ReasonNoGPUNodes, "ReasonIgnored": ReasonIgnored,
			"ReasonApplyFailed": ReasonApplyFailed, "ReasonInvalidSpec": ReasonInvalidSpec,
		}},
		{"controllers/rayjob", map[string]string{
			"ReasonClusterNeverFits": ReasonRayClusterNeverFits, "ReasonClusterGangHeld": ReasonRayClusterGangHeld,
			"ReasonClusterStalled": ReasonRayClusterStalled,
		}},
		{"controllers/raycluster", map[string]string{
			"ReasonInvalidSpec": ReasonInvalidSpec, "ReasonTooManyPods": ReasonTooManyPods, "ReasonNameConflict": ReasonNameConflict,
			"ConditionGang": RayConditionGang, "ConditionGPUs": RayConditionGPUs, "ConditionValid": RayConditionValid,
			"LabelScheduler": RayLabelScheduler, "LabelQueue": RayLabelQueue,
		}},
	}
	for _, tc := range cases {
		have := constants(t, tc.dir)
		for name, ours := range tc.want {
			if have[name] != ours {
				t.Errorf("%s.%s is %q, the plugin explains %q", tc.dir, name, have[name], ours)
			}
		}
	}
	// Literal reasons the reconcilers set without a constant.
	for _, lit := range []struct{ dir, s string }{
		{"controllers/raycluster", `"` + ReasonFailedToApply + `"`},
		{"controllers/raycluster", `"HeadPodNotReady"`},
		{"controllers/raycluster", `"` + ReasonNeverFits + `"`},
		{"controllers/raycluster", `"` + ReasonVolcanoNotInstalled + `"`},
	} {
		if !sourceHas(t, lit.dir, lit.s) {
			t.Errorf("%s no longer sets %s", lit.dir, lit.s)
		}
	}
	// The words by which the advice tells a gang bigger than the cluster.
	if !sourceHas(t, "internal/inventory", moreThanTheCluster, strings.Contains) {
		t.Errorf("internal/inventory no longer says %q in a fit's message", moreThanTheCluster)
	}
}

// sourceHas reports whether a string literal of dir's code is s (or, with
// match, one match accepts).
func sourceHas(t *testing.T, dir, s string, match ...func(lit, s string) bool) bool {
	t.Helper()
	same := func(lit, s string) bool { return lit == s }
	if len(match) > 0 {
		same = match[0]
	}
	found := false
	for _, f := range parseDir(t, dir) {
		{
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && same(lit.Value, s) {
					found = true
				}
				return !found
			})
		}
	}
	return found
}

// parseDir parses the non-test Go files of a directory of the repository.
func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	var files []*ast.File
	fset := token.NewFileSet()
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// TestReasonsDocumented holds every condition and event reason a
// reconciler or the node agent declares (a Reason… constant) to be named,
// in backquotes, in the user documentation of its area, as are the
// reasons the raycluster controller sets as literals.
func TestReasonsDocumented(t *testing.T) {
	cases := []struct {
		dir      string
		docs     []string
		literals []string
	}{
		{"apis/gpu/v1alpha1", []string{"gpu-stack.md", "inventory.md"}, nil},
		{"controllers/clusterpolicy", []string{"gpu-stack.md"}, nil},
		{"controllers/driverupgrade", []string{"gpu-stack.md"}, nil},
		{"controllers/nodelabels", []string{"inventory.md"}, nil},
		{"controllers/monitoring", []string{"monitoring.md"}, nil},
		{"controllers/training", []string{"training.md"}, nil},
		{"internal/gang", []string{"training.md"}, nil},
		{"internal/gang", []string{"ray.md"}, nil},
		{"controllers/raycluster", []string{"ray.md"}, []string{"HeadPodNotReady", "FailedToApply", "Applied", "NeverFits", "Fits",
			"VolcanoNotInstalled", "UnknownScheduler", "RollingGroup"}},
		{"controllers/rayjob", []string{"ray.md"}, []string{"FailedToReconcile", "FailedToDeleteRayJob", "FailedToStopRayJob",
			"StoppedRayJob", "SubmittedRayJob", "CreatedRayCluster", "CreatedRayJobSubmitter", "DeletedRayCluster"}},
	}
	for _, tc := range cases {
		var text string
		for _, d := range tc.docs {
			b, err := os.ReadFile(filepath.Join("..", "..", "docs", d))
			if err != nil {
				t.Fatal(err)
			}
			text += string(b)
		}
		want := map[string]string{}
		for name, v := range constants(t, tc.dir) {
			if strings.HasPrefix(name, "Reason") || strings.HasPrefix(name, "EventReason") {
				want[v] = tc.dir + "." + name
			}
		}
		for _, lit := range tc.literals {
			if !sourceHas(t, tc.dir, strconv.Quote(lit)) {
				t.Errorf("%s no longer sets the reason %q: take it out of this test", tc.dir, lit)
			}
			want[lit] = tc.dir + ` "` + lit + `"`
		}
		for v, where := range want {
			if !strings.Contains(text, "`"+v+"`") {
				t.Errorf("reason %s (%s) is not named in docs/%s", v, where, strings.Join(tc.docs, " or docs/"))
			}
		}
	}
}
