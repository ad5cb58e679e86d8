package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestManagerFlagsDocumented holds every flag of `loom manager` to be
// named, in backquotes, in the README (its "Manager flags" table), where a
// user looks for what the manager takes.
func TestManagerFlagsDocumented(t *testing.T) {
	var help bytes.Buffer
	if code := run(context.Background(), []string{"manager", "-h"}, &help, &help); code != 0 {
		t.Fatalf("loom manager -h: exit %d\n%s", code, help.String())
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	flags := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(help.String(), -1)
	if len(flags) < 20 {
		t.Fatalf("read %d flags from loom manager -h:\n%s", len(flags), help.String())
	}
	for _, f := range flags {
		if !strings.Contains(string(readme), "`--"+f[1]+"`") {
			t.Errorf("loom manager --%s is not in the README", f[1])
		}
	}
}
