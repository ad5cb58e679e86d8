package testenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/loom-dev/loom/internal/manager"
)

// Env is a running API server with every CRD Loom needs installed.
type Env struct {
	Config *rest.Config
	// Client reads straight from the API server (no cache).
	Client client.Client
	Root   string
	env    *envtest.Environment
}

// Start starts etcd and kube-apiserver from the source-built binaries and
// installs the CRDs. Call Stop when done; Main does both around a package's
// tests.
func Start(ctx context.Context) (*Env, error) { return StartWithout(ctx) }

// StartWithout is Start without the CRDs whose group is one of groups (e.g.
// scheduling.volcano.sh, to test behaviour while an optional dependency is
// missing); InstallCRDs adds them later.
func StartWithout(ctx context.Context, groups ...string) (*Env, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	assets, err := ToolDir("kube")
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest with binaries from %s: %w", assets, err)
	}
	e := &Env{Config: cfg, Root: root, env: te}
	e.Client, err = client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		_ = te.Stop()
		return nil, err
	}
	objs, err := ReadManifests(CRDPaths(root)...)
	if err == nil {
		err = Apply(ctx, e.Config, e.Client, crdsWhere(objs, func(g string) bool { return !slices.Contains(groups, g) }))
	}
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("installing CRDs: %w", err)
	}
	return e, nil
}

// InstallCRDs installs the CRDs of the given groups (left out by
// StartWithout) and waits until they are established.
func (e *Env) InstallCRDs(ctx context.Context, groups ...string) error {
	return e.install(ctx, func(o *unstructured.Unstructured) bool {
		g, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		return slices.Contains(groups, g)
	})
}

// InstallCRDsNamed installs only the named CRDs (plural.group) of a group
// StartWithout left out, as a cluster where a dependency installed some of
// its CRDs, and waits until they are established.
func (e *Env) InstallCRDsNamed(ctx context.Context, names ...string) error {
	return e.install(ctx, func(o *unstructured.Unstructured) bool { return slices.Contains(names, o.GetName()) })
}

func (e *Env) install(ctx context.Context, keep func(*unstructured.Unstructured) bool) error {
	objs, err := ReadManifests(CRDPaths(e.Root)...)
	if err != nil {
		return err
	}
	objs = slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool { return !keep(o) })
	if err := Apply(ctx, e.Config, e.Client, objs); err != nil {
		return err
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		names = append(names, o.GetName())
	}
	return WaitForCRDs(ctx, e.Config, names...)
}

func crdsWhere(objs []*unstructured.Unstructured, keep func(group string) bool) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		g, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		if keep(g) {
			out = append(out, o)
		}
	}
	return out
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error { return e.env.Stop() }

// Main is a TestMain body: it starts the environment into *env, runs the
// package's tests and stops it again. LOOM_TEST_LOG=debug|info|error sets the
// level of the manager logs the tests print (default: error).
func Main(m *testing.M, env **Env) { MainWithout(m, env) }

// MainWithout is Main with StartWithout(groups).
func MainWithout(m *testing.M, env **Env, groups ...string) {
	level, err := manager.ParseLogLevel(os.Getenv("LOOM_TEST_LOG"))
	if os.Getenv("LOOM_TEST_LOG") == "" || err != nil {
		level = zapcore.ErrorLevel
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(level), zap.UseDevMode(true)))
	if fuzzing() {
		// Fuzz targets test pure functions: neither the coordinator nor
		// each of its workers needs an API server of its own.
		os.Exit(m.Run())
	}

	started := time.Now()
	e, err := StartWithout(context.Background(), groups...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "testenv: API server up with CRDs in %s\n", time.Since(started).Round(10*time.Millisecond))
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping: %v\n", err)
	}
	os.Exit(code)
}

// CreateNamespace creates a namespace (ignoring "already exists").
func (e *Env) CreateNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	return client.IgnoreAlreadyExists(e.Client.Create(ctx, ns))
}

// fuzzing reports whether this test binary runs as go test -fuzz (its
// coordinator or a worker) with no test selected beside the fuzz target.
func fuzzing() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	lookup := func(name string) string {
		if f := flag.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	return lookup("test.fuzzworker") == "true" || (lookup("test.fuzz") != "" && lookup("test.run") == "^$")
}
