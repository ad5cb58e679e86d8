package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/cli"
	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/uninstall"
)

// runCleanup is `loom uninstall-cleanup`, the chart's pre-delete hook (see
// uninstall.Run).
func runCleanup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loom uninstall-cleanup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := uninstall.Config{Poll: time.Second}
	fs.StringVar(&cfg.Namespace, "namespace", manager.DefaultOptions().Namespace, "namespace Loom runs in (default: $POD_NAMESPACE)")
	fs.StringVar(&cfg.ManagerDeployment, "manager-deployment", "", "the manager's Deployment, stopped once the claimed nodes are released")
	fs.StringVar(&cfg.AgentDaemonSet, "node-agent-daemonset", "", "the node agent's DaemonSet, stopped before the GPUNodes are deleted")
	fs.StringVar(&cfg.Lease, "leader-election-id", "loom-manager", "the manager's leader-election Lease: the manager is gone when no one holds it")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "how long to wait for each step")
	fs.BoolVar(&cfg.RayJobs, "rayjob-finalizers", false, "remove the stop-job finalizer Loom's rayjob controller put on RayJobs (no one would remove it once the manager is gone)")
	fs.BoolVar(&cfg.Workloads, "workload-finalizers", false, "remove Kueue's resource-in-use finalizer from the Workloads of TrainingJobs (Kueue leaves it on Workloads with an owner)")
	var common cli.Common
	common.Bind(fs)
	if code, done := cli.Parse(fs, &common, args, stdout); done {
		return code
	}
	rc, err := common.RestConfig()
	if err != nil {
		fmt.Fprintf(stderr, "loom uninstall-cleanup: %v\n", err)
		return 1
	}
	rc.UserAgent = "loom-uninstall-cleanup"
	c, err := client.New(rc, client.Options{Scheme: manager.Scheme()})
	if err == nil {
		err = uninstall.Run(ctx, c, cfg, stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "loom uninstall-cleanup: %v\n", err)
		return 1
	}
	return 0
}
