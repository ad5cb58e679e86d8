package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/uninstall"
)

func newUninstallCleanupCommand(o *options) *cobra.Command {
	cfg := uninstall.Config{Poll: time.Second}
	var release string
	cmd := &cobra.Command{
		Use:   "uninstall-cleanup",
		Short: "Remove what Loom leaves outside its Helm release (the chart's uninstall.cleanup hook, by hand)",
		Long: `Remove what Loom leaves on the cluster outside its Helm release, with the
code of the chart's pre-delete hook (uninstall.cleanup=true), for a release
installed without it or uninstalled with --no-hooks. In order:

 1. delete every ClusterPolicy, and wait until its operand DaemonSets are
    gone and the driver upgrade released (uncordoned) every node it claimed:
    a running manager releases them, so run this before helm uninstall;
 2. delete the manager Deployment and the node agent DaemonSet, wait until
    the leader Lease is free and the manager's and the agents' pods are
    gone (a manager run without leader election holds no Lease; a pod on a
    node that is not Ready, whose kubelet cannot stop it, is named and not
    waited for), then release the nodes the driver upgrade still claims
    (below);
 3. delete every GPUNode and Loom's nvidia RuntimeClass, and on every Node
    the nvidia.com/* labels, annotations and unhealthy taint Loom's labeller
    set; labels and taints anyone else set stay;
 4. with --rayjob-finalizers, take KubeRay's stop-job finalizer, which
    Loom's rayjob controller adds, off every RayJob;
 5. take Kueue's resource-in-use finalizer, which Loom's trainingjob
    controller puts on its Workloads, off the Workloads of TrainingJobs
    (--workload-finalizers=false leaves them).

A node the driver upgrade still claims once the manager is stopped (its
driver upgrade did not release it, or no manager led: no wait then) is
released here as the manager would:
Loom's cordon lifted (a cordon that was there before, or set since by
someone else, stays, and the node is named), its state label and
annotations removed. The command goes on past what it cannot do, and
exits non-zero naming it.

-n names Loom's namespace (required). The release in it is found by its
manager Deployment's labels (app.kubernetes.io/part-of=loom,
app.kubernetes.io/component=manager; the release is its
app.kubernetes.io/instance), and its node agent DaemonSet and leader
Lease from it; --release picks one of several, and --manager-deployment,
--node-agent-daemonset and --leader-election-id override what is found.
No release there while a Loom manager runs in another namespace (a
mistyped -n or --release) is an error naming it, before anything is
deleted.
Loom's CRDs, the namespace and the Helm release stay.`,
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
			found, err := findRelease(cmd.Context(), c, cfg.Namespace, release, o.streams.Out)
			if err != nil {
				return err
			}
			f := cmd.Flags()
			for flag, v := range map[string]*string{"manager-deployment": &cfg.ManagerDeployment, "node-agent-daemonset": &cfg.AgentDaemonSet,
				"leader-election-id": &cfg.Lease} {
				if !f.Changed(flag) {
					*v = found[flag]
				}
			}
			return uninstall.Run(cmd.Context(), c, cfg, o.streams.Out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&release, "release", "", "the Helm release to clean up, when -n holds several (default: the one found)")
	f.StringVar(&cfg.ManagerDeployment, "manager-deployment", "", "the manager's Deployment (default: the release's, found by its labels)")
	f.StringVar(&cfg.AgentDaemonSet, "node-agent-daemonset", "", "the node agent's DaemonSet (default: the release's, found by its labels)")
	f.StringVar(&cfg.Lease, "leader-election-id", "", "the manager's leader-election Lease (default: the manager's --leader-election-id, else loom-manager)")
	f.BoolVar(&cfg.RayJobs, "rayjob-finalizers", false, "remove the stop-job finalizer Loom's rayjob controller put on RayJobs (leave it off when KubeRay's operator runs RayJobs)")
	f.BoolVar(&cfg.Workloads, "workload-finalizers", true, "remove Kueue's resource-in-use finalizer from the Workloads of TrainingJobs (no Kueue: nothing to do)")
	f.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "how long to wait for each step")
	return cmd
}

// findRelease finds Loom's release in namespace (release: that one) by its
// manager Deployment's and node agent DaemonSet's labels, and returns the
// flags' values it gives: manager-deployment, node-agent-daemonset and
// leader-election-id (the manager's, else the manager's default). None
// found (uninstalled already) is said, and there is nothing to stop;
// several releases without --release is an error naming them.
func findRelease(ctx context.Context, c client.Client, namespace, release string, out io.Writer) (map[string]string, error) {
	sel := client.MatchingLabels{"app.kubernetes.io/part-of": "loom", "app.kubernetes.io/component": "manager"}
	if release != "" {
		sel["app.kubernetes.io/instance"] = release
	}
	deps := &appsv1.DeploymentList{}
	if err := c.List(ctx, deps, client.InNamespace(namespace), sel); err != nil {
		return nil, fmt.Errorf("finding Loom's manager Deployment in %s: %w", namespace, err)
	}
	found := map[string]string{"leader-election-id": "loom-manager"}
	switch len(deps.Items) {
	case 0:
		if err := refuseWhileLoomRunsElsewhere(ctx, c, namespace, release, out); err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "no Loom manager Deployment in namespace %s (labels %s): no manager to stop\n", namespace, labels.Set(sel))
	case 1:
		d := &deps.Items[0]
		release = d.Labels["app.kubernetes.io/instance"]
		found["manager-deployment"] = d.Name
		for _, ctr := range d.Spec.Template.Spec.Containers {
			for _, arg := range ctr.Args {
				if v, ok := strings.CutPrefix(arg, "--leader-election-id="); ok {
					found["leader-election-id"] = v
				}
			}
		}
		fmt.Fprintf(out, "found Loom's release %q in namespace %s: manager Deployment %s, leader Lease %s\n", release, namespace, d.Name, found["leader-election-id"])
	default:
		var names []string
		for _, d := range deps.Items {
			names = append(names, fmt.Sprintf("%s (Deployment %s)", d.Labels["app.kubernetes.io/instance"], d.Name))
		}
		return nil, fmt.Errorf("namespace %s holds %d Loom releases: %s; name one with --release", namespace, len(names), strings.Join(names, ", "))
	}
	sel["app.kubernetes.io/component"] = "node-agent"
	if release != "" {
		sel["app.kubernetes.io/instance"] = release
	}
	dss := &appsv1.DaemonSetList{}
	if err := c.List(ctx, dss, client.InNamespace(namespace), sel); err != nil {
		return nil, fmt.Errorf("finding Loom's node agent DaemonSet in %s: %w", namespace, err)
	}
	switch len(dss.Items) {
	case 0:
		fmt.Fprintf(out, "no Loom node agent DaemonSet in namespace %s (labels %s): no node agent to stop\n", namespace, labels.Set(sel))
	case 1:
		found["node-agent-daemonset"] = dss.Items[0].Name
	default:
		var names []string
		for _, ds := range dss.Items {
			names = append(names, fmt.Sprintf("%s (DaemonSet %s)", ds.Labels["app.kubernetes.io/instance"], ds.Name))
		}
		return nil, fmt.Errorf("namespace %s holds %d Loom node agents: %s; name one with --release or --node-agent-daemonset", namespace, len(names), strings.Join(names, ", "))
	}
	return found, nil
}

// refuseWhileLoomRunsElsewhere: no release found where -n and --release
// say (a typo, or the release is gone) while a Loom manager runs in the
// cluster is an error naming it, since the cleanup would delete every
// ClusterPolicy (and so the GPU stack's operands on every node) and
// GPUNode that manager serves. One who may not list Deployments in every
// namespace is told it could not be checked, and goes on.
func refuseWhileLoomRunsElsewhere(ctx context.Context, c client.Client, namespace, release string, out io.Writer) error {
	deps := &appsv1.DeploymentList{}
	err := c.List(ctx, deps, client.MatchingLabels{"app.kubernetes.io/part-of": "loom", "app.kubernetes.io/component": "manager"})
	if apierrors.IsForbidden(err) {
		fmt.Fprintf(out, "cannot tell whether a Loom manager runs in another namespace (may not list Deployments in every namespace)\n")
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking for Loom's manager Deployment in other namespaces: %w", err)
	}
	var running []string
	for _, d := range deps.Items {
		running = append(running, fmt.Sprintf("release %s in namespace %s (Deployment %s)", d.Labels["app.kubernetes.io/instance"], d.Namespace, d.Name))
	}
	if len(running) == 0 {
		return nil
	}
	which := "no Loom release"
	if release != "" {
		which = fmt.Sprintf("no Loom release %q", release)
	}
	return fmt.Errorf("%s in namespace %s, but Loom's manager runs as %s: the cleanup would delete every ClusterPolicy and GPUNode it serves; "+
		"name its namespace with -n (and its release with --release)", which, namespace, strings.Join(running, ", "))
}
