package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestArchitectureLayoutComplete holds docs/architecture.md's layout to
// name every package directory under cmd, controllers and internal, so that
// a reader finds each one there.
func TestArchitectureLayoutComplete(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, top := range []string{"cmd", "controllers", "internal"} {
		dirs, err := os.ReadDir(filepath.Join("../..", top))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			if !d.IsDir() {
				continue
			}
			name := top + "/" + d.Name()
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s`).Match(doc) {
				t.Errorf("docs/architecture.md's layout does not name %s", name)
			}
		}
	}
}
