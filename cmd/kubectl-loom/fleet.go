package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/sharing"
	"github.com/loom-dev/loom/internal/why"
)

// boundPods selects the pods bound to a node that have not finished.
var boundPods = fields.AndSelectors(
	fields.OneTermNotEqualSelector("spec.nodeName", ""),
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
)

func newGPUsCommand(o *options) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "Show every GPU node: product, GPUs, unhealthy ones, each nvidia.com/* resource allocated and free, MIG layout",
		Long: `Show every GPU node: its product and GPUs, the unhealthy ones, and for each
nvidia.com/* resource (whole GPUs, MIG profiles, shared GPUs) what the node
offers, what the pods bound to it request and what is free; its MIG layout
(nvidia.com/mig.config and its state) and whether it takes pods.
With -o wide, the pods that hold each resource.`,
		Example: `  kubectl loom gpus
  kubectl loom gpus -o wide`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			fleet, err := o.fleet(cmd.Context())
			if err != nil {
				return err
			}
			if out == "json" || out == "yaml" {
				return o.printData(out, fleet)
			}
			if len(fleet) == 0 {
				_, err := fmt.Fprintln(o.streams.ErrOut, noGPUNodes)
				return err
			}
			return why.WriteFleet(o.streams.Out, fleet, out == "wide")
		},
	}
	addOutput(cmd, &out)
	return cmd
}

// noGPUNodes is what gpus and upgrades say, on standard error as kubectl
// get does, where no node is a GPU node (why.IsGPUNode).
const noGPUNodes = "No GPU nodes found (no node has a GPUNode, the nvidia.com/gpu.present label or a GPU resource)"

// fleet lists the nodes, the GPUNodes (an error saying Loom is not
// installed without their CRD) and the bound, unfinished pods, each once,
// and reads the sharing configs' GPU resource names.
func (o *options) fleet(ctx context.Context) ([]why.FleetNode, error) {
	c, err := o.client()
	if err != nil {
		return nil, err
	}
	nodes, err := listNodes(ctx, c)
	if err != nil {
		return nil, err
	}
	var gns []gpuv1alpha1.GPUNode
	gl := &gpuv1alpha1.GPUNodeList{}
	if err := pages(ctx, c, gl, func() { gns = append(gns, gl.Items...) }); err != nil {
		return nil, explainGet(err, "GPUNode", "", "")
	}
	var pods []corev1.Pod
	pl := &corev1.PodList{}
	if err := pages(ctx, c, pl, func() { pods = append(pods, pl.Items...) }, client.MatchingFieldsSelector{Selector: boundPods}); err != nil {
		return nil, err
	}
	src, err := sharingSource(ctx, c)
	if err != nil {
		return nil, err
	}
	fleet := why.Fleet(nodes, gns, pods, sharing.NamesOf(src))
	return fleet, o.checkManager(ctx, c, len(fleet))
}

// managerLabels are the chart's labels on the manager's Deployment.
var managerLabels = client.MatchingLabels{"app.kubernetes.io/part-of": "loom", "app.kubernetes.io/component": "manager"}

// checkManager looks for a Loom manager's Deployment in every namespace:
// without one (helm uninstall leaves Loom's CRDs and what was written in
// them), an answer of no rows is an error saying Loom is not installed,
// and other answers are followed by a warning that they may be stale. One
// who may not list Deployments is told nothing.
func (o *options) checkManager(ctx context.Context, c client.Client, rows int) error {
	l := &appsv1.DeploymentList{}
	err := c.List(ctx, l, managerLabels, client.Limit(1))
	if apierrors.IsForbidden(err) || len(l.Items) > 0 {
		return nil
	}
	if err != nil {
		return err
	}
	const none = "no Loom manager is installed (no Deployment labelled app.kubernetes.io/part-of=loom,app.kubernetes.io/component=manager in any namespace)"
	if rows == 0 {
		return fmt.Errorf("%s: is Loom installed? (helm install loom charts/loom)", none)
	}
	_, err = fmt.Fprintf(o.streams.ErrOut, "Warning: %s: what it wrote may be stale\n", none)
	return err
}

func listNodes(ctx context.Context, c client.Client) ([]corev1.Node, error) {
	var nodes []corev1.Node
	nl := &corev1.NodeList{}
	err := pages(ctx, c, nl, func() { nodes = append(nodes, nl.Items...) })
	return nodes, err
}
