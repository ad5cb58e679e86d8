package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/spf13/cobra"
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
	return root
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
