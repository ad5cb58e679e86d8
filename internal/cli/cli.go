// Package cli is what Loom's two binaries (loom, the manager's, and
// loom-node-agent) share on their command lines: the cluster flags, flag
// parsing with --version, and logging.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/loom-dev/loom/internal/manager"
)

// Common are the flags every command that talks to a cluster has.
type Common struct {
	Kubeconfig  string
	ShowVersion bool
}

// Bind adds the flags to fs.
func (f *Common) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "path of a kubeconfig (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)")
	fs.BoolVar(&f.ShowVersion, "version", false, "print the version and exit")
}

// RestConfig is the cluster's config: from --kubeconfig when given, else
// as controller-runtime finds one.
func (f *Common) RestConfig() (*rest.Config, error) {
	if f.Kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", f.Kubeconfig)
	}
	return ctrl.GetConfig()
}

// Parse parses args into fs; done means exit with code (help, --version or
// a bad flag).
func Parse(fs *flag.FlagSet, common *Common, args []string, stdout io.Writer) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		return 2, true
	}
	if common.ShowVersion {
		fmt.Fprintln(stdout, "loom", manager.Version())
		return 0, true
	}
	// Parsing stops at the first argument that is not a flag, and none of
	// these commands takes one: "--leader-elect false" would leave the
	// flag on and drop every flag after it without a word.
	if fs.NArg() > 0 {
		msg := fmt.Sprintf("%s: unexpected argument %q: every setting is a flag", fs.Name(), fs.Arg(0))
		if i := len(args) - fs.NArg() - 1; i >= 0 {
			if name := strings.TrimLeft(args[i], "-"); name != args[i] {
				if f := fs.Lookup(name); f != nil && isBoolFlag(f) {
					msg += fmt.Sprintf(", and a boolean takes its value after '=' (--%s=%s)", name, fs.Arg(0))
				}
			}
		}
		fmt.Fprintln(fs.Output(), msg)
		return 2, true
	}
	return 0, false
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// SetupLogging sets controller-runtime's logger: JSON or text ("text") at
// logLevel, validated already (manager.ParseLogLevel).
func SetupLogging(logLevel, logFormat string, w io.Writer) {
	level, _ := manager.ParseLogLevel(logLevel)
	zopts := []zap.Opts{zap.WriteTo(w), zap.Level(level), zap.StacktraceLevel(zapcore.PanicLevel)}
	if logFormat == "text" {
		zopts = append(zopts, zap.ConsoleEncoder())
	} else {
		zopts = append(zopts, zap.JSONEncoder())
	}
	ctrl.SetLogger(zap.New(zopts...))
}
