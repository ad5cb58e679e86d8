package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	trainingv1alpha1 "github.com/loom-dev/loom/apis/training/v1alpha1"
)

// pageSize is how many objects one list call asks for.
const pageSize = 500

// options are the flags every subcommand shares: kubectl's connection
// flags, bound by client-go's clientcmd as kubectl binds them (cli-runtime's
// ConfigFlags would link kustomize, whose use of Go's plugin package makes
// the binary bind every symbol at start).
type options struct {
	loading   *clientcmd.ClientConfigLoadingRules
	overrides *clientcmd.ConfigOverrides
	streams   genericiooptions.IOStreams
	now       func() time.Time
}

func (o *options) config() clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(o.loading, o.overrides)
}

func newRootCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{loading: clientcmd.NewDefaultClientConfigLoadingRules(), overrides: &clientcmd.ConfigOverrides{},
		streams: streams, now: time.Now}
	root := &cobra.Command{
		Use:   "kubectl-loom",
		Short: "Ask Loom why a job, Ray cluster, policy or node is stuck; show the GPU fleet and its driver upgrades",
		Long: `kubectl loom answers the questions kubectl describe leaves to you:

  kubectl loom why trainingjob/<name>   why a job is pending or failed, and what to do
  kubectl loom gpus                     every GPU node: GPUs allocated, free, unhealthy; MIG layout
  kubectl loom upgrades                 the driver upgrade's progress, node by node
  kubectl loom uninstall-cleanup -n NS  remove what Loom leaves outside its Helm release`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl loom"},
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.PersistentFlags().StringVar(&o.loading.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "Path to the kubeconfig file to use")
	clientcmd.BindOverrideFlags(o.overrides, root.PersistentFlags(), clientcmd.RecommendedConfigOverrideFlags(""))
	root.AddCommand(newWhyCommand(o), newGPUsCommand(o), newUpgradesCommand(o), newUninstallCleanupCommand(o))
	for _, cmd := range root.Commands() {
		if run, needs := cmd.RunE, rights[cmd.Name()]; run != nil && needs != "" {
			cmd.RunE = func(cmd *cobra.Command, args []string) error {
				return explainForbidden(run(cmd, args), cmd.Name(), needs)
			}
		}
	}
	return root
}

// rights are the rights each command needs (README: "Rights each command
// needs"); what it can do without is said in the answer instead.
var rights = map[string]string{
	"why": "get on the object (trainingjobs, rayclusters or rayjobs in its namespace; clusterpolicies, gpunodes or nodes); " +
		"for a node, get gpunodes too. Left out of the answer without them: list events, list clusterpolicies and daemonsets " +
		"and get configmaps (the GPU resource names a ClusterPolicy renames), list nodes, gpunodes and pods (a waiting job's GPUs now)",
	"gpus": "list nodes, gpunodes and pods (every namespace). Left out without them: list clusterpolicies and daemonsets, get configmaps " +
		"(the GPU resource names a ClusterPolicy renames), list deployments in every namespace (whether a Loom manager is installed)",
	"upgrades": "list clusterpolicies and nodes. Left out without them: list daemonsets, get configmaps (the GPU resource names a ClusterPolicy renames), " +
		"list deployments in every namespace (whether a Loom manager is installed)",
	"uninstall-cleanup": "those of the chart's <fullname>-uninstall-cleanup ClusterRole and Role (uninstall.cleanup=true): list and delete " +
		"clusterpolicies and gpunodes; list, get and patch nodes; get and delete runtimeclass nvidia; in Loom's namespace list deployments, daemonsets " +
		"and pods, get and delete the manager's Deployment and the node agent's DaemonSet, get the leader Lease; " +
		"with --rayjob-finalizers, list and patch rayjobs; with --workload-finalizers (the default), list and patch workloads (kueue.x-k8s.io)",
}

// explainForbidden adds to a Forbidden error, which names one missing
// right, every right the command needs, so that one request for access is
// enough.
func explainForbidden(err error, command, needs string) error {
	if !apierrors.IsForbidden(err) {
		return err
	}
	return fmt.Errorf("%w\nkubectl loom %s needs %s", err, command, needs)
}

// scheme holds every kind the plugin reads.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(gpuv1alpha1.AddToScheme(s))
	utilruntime.Must(trainingv1alpha1.AddToScheme(s))
	utilruntime.Must(rayv1.AddToScheme(s))
	return s
}

// client is a direct (uncached) client from the kubeconfig flags.
func (o *options) client() (client.Client, error) {
	cfg, err := o.config().ClientConfig()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme()})
}

// namespace is -n, else the kubeconfig context's namespace, else default.
func (o *options) namespace() (string, error) {
	ns, _, err := o.config().Namespace()
	return ns, err
}

// addOutput adds -o/--output: "" (a table or text), wide, json or yaml.
func addOutput(cmd *cobra.Command, out *string) {
	cmd.Flags().StringVarP(out, "output", "o", "", "Output format: wide, json or yaml")
}

func checkOutput(out string) error {
	switch out {
	case "", "wide", "json", "yaml":
		return nil
	}
	return fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: json, wide, yaml", out)
}

// printData prints v as JSON or YAML (out is json or yaml).
func (o *options) printData(out string, v any) error {
	b, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return err
	}
	if out == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
	} else {
		b = append(b, '\n')
	}
	_, err = o.streams.Out.Write(b)
	return err
}

// pages lists list page by page, calling collect after each page.
func pages(ctx context.Context, c client.Client, list client.ObjectList, collect func(), opts ...client.ListOption) error {
	cont := ""
	for {
		o := append([]client.ListOption{client.Limit(pageSize), client.Continue(cont)}, opts...)
		if err := c.List(ctx, list, o...); err != nil {
			return err
		}
		collect()
		if cont = list.GetContinue(); cont == "" {
			return nil
		}
	}
}
