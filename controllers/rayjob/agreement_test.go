package rayjob

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The RayJob reads the RayCluster conditions Loom's raycluster controller
// writes by name (the two never import each other): this holds the names
// equal to that controller's source, so a rename there fails here.
func TestClusterConditionsAreTheRayClusterControllers(t *testing.T) {
	consts, lits := rayclusterSource(t)
	for name, ours := range map[string]string{
		"ConditionGPUs": clusterConditionGPUs, "ConditionGang": clusterConditionGang, "ConditionStalled": clusterConditionStalled,
	} {
		if consts[name] != ours {
			t.Errorf("raycluster.%s is %q; the RayJob reads %q", name, consts[name], ours)
		}
	}
	if !lits[reasonVolcanoNotInstalled] {
		t.Errorf("the raycluster controller no longer sets the reason %q", reasonVolcanoNotInstalled)
	}
}

// rayclusterSource is the string constants (by name) and the string
// literals of the raycluster controller's non-test code.
func rayclusterSource(t *testing.T) (map[string]string, map[string]bool) {
	t.Helper()
	names, err := filepath.Glob(filepath.Join("..", "raycluster", "*.go"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no raycluster sources: %v", err)
	}
	consts, lits := map[string]string{}, map[string]bool{}
	fset := token.NewFileSet()
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(node ast.Node) bool {
			switch v := node.(type) {
			case *ast.ValueSpec:
				for i, id := range v.Names {
					if lit, ok := valueAt(v, i); ok {
						consts[id.Name] = lit
					}
				}
			case *ast.BasicLit:
				if s, err := strconv.Unquote(v.Value); err == nil && v.Kind == token.STRING {
					lits[s] = true
				}
			}
			return true
		})
	}
	return consts, lits
}

func valueAt(v *ast.ValueSpec, i int) (string, bool) {
	if i >= len(v.Values) {
		return "", false
	}
	lit, ok := v.Values[i].(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}
