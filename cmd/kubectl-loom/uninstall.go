package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/loom-dev/loom/internal/uninstall"
)

func newUninstallCleanupCommand(o *options) *cobra.Command {
	cfg := uninstall.Config{Poll: time.Second}
	cmd := &cobra.Command{
		Use:   "uninstall-cleanup",
		Short: "Remove what Loom leaves outside its Helm release (the chart's uninstall.cleanup hook, by hand)",
		Long: `Remove what Loom leaves on the cluster outside its Helm release, with the
code of the chart's pre-delete hook (uninstall.cleanup=true), for a release
installed without it or uninstalled with --no-hooks. In order:

 1. delete every ClusterPolicy, and wait until its operand DaemonSets are
    gone and the driver upgrade released (uncordoned) every node it claimed:
    only a running manager releases them, so run this before helm uninstall;
 2. delete the manager Deployment and the node agent DaemonSet, and wait
    until the leader Lease is free and the agents' pods are gone;
 3. delete every GPUNode and Loom's nvidia RuntimeClass, and on every Node
    the nvidia.com/* labels, annotations and unhealthy taint Loom's labeller
    set; labels and taints anyone else set stay;
 4. with --rayjob-finalizers, take KubeRay's stop-job finalizer, which
    Loom's rayjob controller adds, off every RayJob.

-n names Loom's namespace (required). Loom's CRDs, the namespace and the
Helm release stay.`,
		Example: `  kubectl loom uninstall-cleanup -n loom-system --rayjob-finalizers
  helm uninstall loom -n loom-system`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.overrides.Context.Namespace == "" {
				return errors.New("name Loom's namespace with -n (the chart's release namespace, e.g. -n loom-system)")
			}
			cfg.Namespace = o.overrides.Context.Namespace
			c, err := o.client()
			if err != nil {
				return err
			}
			return uninstall.Run(cmd.Context(), c, cfg, o.streams.Out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.ManagerDeployment, "manager-deployment", "loom-manager", "the manager's Deployment (<release>-manager)")
	f.StringVar(&cfg.AgentDaemonSet, "node-agent-daemonset", "loom-node-agent", "the node agent's DaemonSet (<release>-node-agent)")
	f.StringVar(&cfg.Lease, "leader-election-id", "loom-manager", "the manager's leader-election Lease (manager.leaderElection.leaseName)")
	f.BoolVar(&cfg.RayJobs, "rayjob-finalizers", false, "remove the stop-job finalizer Loom's rayjob controller put on RayJobs (leave it off when KubeRay's operator runs RayJobs)")
	f.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "how long to wait for each step")
	return cmd
}
