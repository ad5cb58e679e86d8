package manager_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/manager"
	"github.com/loom-dev/loom/internal/testenv"
)

// --watch-namespaces names the users' namespaces (the chart's
// manager.watchNamespaces: [ml-a]); Loom's own namespace, where the
// ClusterPolicy's operand DaemonSets, ServiceAccounts and ConfigMaps live,
// and the dashboards' namespace stay readable through the manager's cache.
func TestWatchNamespacesKeepLoomsOwnNamespace(t *testing.T) {
	ctx := context.Background()
	opts := testenv.ManagerOptions(t)
	opts.Namespace = "loom-watchns"
	opts.WatchNamespaces = []string{"ml-a"}
	opts.DashboardsNamespace = "grafana-watchns"
	opts.LeaderElect = false
	for _, ns := range []string{"ml-a", opts.DashboardsNamespace} {
		if err := env.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	var mgr ctrl.Manager
	reg := &manager.Registry{}
	reg.Add("grab", func(_ context.Context, m ctrl.Manager, _ manager.Options) error { mgr = m; return nil })
	env.StartManager(t, opts, reg)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if !mgr.GetCache().WaitForCacheSync(cctx) {
		t.Fatal("cache did not sync")
	}
	c := mgr.GetClient()
	for _, read := range []struct {
		what string
		list client.ObjectList
		ns   string
	}{
		{"operand DaemonSets in Loom's namespace", &appsv1.DaemonSetList{}, opts.Namespace},
		{"operand ServiceAccounts in Loom's namespace", &corev1.ServiceAccountList{}, opts.Namespace},
		{"ConfigMaps in Loom's namespace", &corev1.ConfigMapList{}, opts.Namespace},
		{"the dashboards ConfigMap's namespace", &corev1.ConfigMapList{}, opts.DashboardsNamespace},
		{"TrainingJob pods in a watched namespace", &corev1.PodList{}, "ml-a"},
	} {
		if err := c.List(cctx, read.list, client.InNamespace(read.ns)); err != nil {
			t.Errorf("%s: %v", read.what, err)
		}
	}
}
