package manager_test

import (
	"context"
	"testing"

	"github.com/go-logr/logr"

	"github.com/loom-dev/loom/internal/manager"
)

// BenchmarkEnsureCRDsCurrent is a manager's start against Loom's own CRDs
// (about 680 KB of YAML) when they are this build's already.
//
//	KUBEBUILDER_ASSETS=$(hack/tools/build.sh kube) go test -run '^$' -bench EnsureCRDsCurrent -benchmem ./internal/manager/
func BenchmarkEnsureCRDsCurrent(b *testing.B) {
	ctx := context.Background()
	if _, err := manager.EnsureCRDs(ctx, env.Config, env.Client, "v0.9.0", logr.Discard()); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		applied, err := manager.EnsureCRDs(ctx, env.Config, env.Client, "v0.9.0", logr.Discard())
		if err != nil || len(applied) != 0 {
			b.Fatalf("applied %v: %v", applied, err)
		}
	}
}
