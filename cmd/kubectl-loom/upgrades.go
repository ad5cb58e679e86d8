package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
	"github.com/loom-dev/loom/internal/why"
)

// upgrades is what `kubectl loom upgrades -o json` prints.
type upgrades struct {
	Policies []why.PolicyUpgrade `json:"policies"`
	Nodes    []why.UpgradeNode   `json:"nodes"`
}

func newUpgradesCommand(o *options) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "upgrades",
		Short: "Show the driver upgrade's progress: the policy's DriverUpgrade condition, then each GPU node's state",
		Long: `Show the driver upgrade's progress: the DriverUpgrade condition of the
ClusterPolicy in force, then per GPU node its nvidia.com/gpu-driver-upgrade-state,
the policy that claimed it (gpu.loom.dev/driver-upgrade-claim; a state without
a claim is not Loom's and is left alone), its cordon, how long it has been in
its state, and a failure or a refused eviction. Failed nodes come first.`,
		Example: `  kubectl loom upgrades
  kubectl loom upgrades -o wide`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			u, err := o.upgrades(cmd.Context())
			if err != nil {
				return err
			}
			if out == "json" || out == "yaml" {
				return o.printData(out, u)
			}
			if err := why.WriteUpgrades(o.streams.Out, u.Policies, u.Nodes, out == "wide"); err != nil || len(u.Nodes) > 0 {
				return err
			}
			_, err = fmt.Fprintln(o.streams.ErrOut, noGPUNodes)
			return err
		},
	}
	addOutput(cmd, &out)
	return cmd
}

func (o *options) upgrades(ctx context.Context) (upgrades, error) {
	c, err := o.client()
	if err != nil {
		return upgrades{}, err
	}
	cps, err := listPolicies(ctx, c)
	if err != nil {
		return upgrades{}, explainGet(err, "ClusterPolicy", "", "")
	}
	nodes, err := listNodes(ctx, c)
	if err != nil {
		return upgrades{}, err
	}
	src, err := policySharing(ctx, c, gpuv1alpha1.Active(cps))
	if err != nil {
		return upgrades{}, err
	}
	// -o json prints [] for none, not null.
	u := upgrades{Policies: []why.PolicyUpgrade{}, Nodes: []why.UpgradeNode{}}
	u.Policies = append(u.Policies, why.Upgrades(cps)...)
	u.Nodes = append(u.Nodes, why.UpgradeNodes(nodes, o.now(), sharing.NamesOf(src))...)
	return u, o.checkManager(ctx, c, len(u.Policies)+len(u.Nodes))
}
