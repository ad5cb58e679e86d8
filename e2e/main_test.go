// Package e2e holds Loom's end-to-end tests: a simulated cluster built from
// source (framework), the chart installed with helm, and the manager running
// under the chart's own service account.
package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/loom-dev/loom/e2e/framework"
)

var (
	cluster *framework.Cluster
	loomBin string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard()) // the tests' own clients: no stack trace
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	started := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "e2e %6.1fs: %s\n", time.Since(started).Seconds(), fmt.Sprintf(format, args...))
	}
	var err error
	cluster, err = framework.Start(ctx, framework.Options{KeepDir: os.Getenv("LOOM_E2E_KEEP") != "", Logf: logf})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: starting the simulated cluster: %v\n", err)
		return 1
	}
	defer func() {
		cluster.Stop()
		logf("cluster stopped")
	}()
	if loomBin, err = framework.BuildLoom(cluster.Dir); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "e2e: logs of every process are in %s (LOOM_E2E_KEEP=1 keeps it)\n", cluster.Dir)
	}
	return code
}
