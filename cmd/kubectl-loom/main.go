// Command kubectl-loom is a kubectl plugin (kubectl loom) that answers
// "why" for Loom's objects and shows the GPU fleet and its driver upgrades.
// It takes kubectl's connection flags (--kubeconfig, --context, -n, …),
// prints errors to stderr and exits 1 on any error.
package main

import (
	"fmt"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	ctrllog.SetLogger(logr.Discard())
	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	if err := newRootCommand(streams).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
