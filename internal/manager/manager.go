// Package manager builds Loom's controller manager: one controller-runtime
// manager with a shared cache, secured metrics, probes and leader election,
// running the controllers chosen from a Registry.
package manager

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
)

// Leader election (a Role in Loom's namespace), events and the metrics
// endpoint's authentication need these rights; the controllers add
// their own markers next to their code.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=loom-system,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// New builds the manager and sets up the selected controllers. It does not
// start anything.
func New(ctx context.Context, cfg *rest.Config, opts Options, reg *Registry) (ctrl.Manager, []string, error) {
	if err := opts.Validate(); err != nil {
		return nil, nil, err
	}
	selected, err := reg.Select(opts.Controllers)
	if err != nil {
		return nil, nil, err
	}

	cfg = rest.CopyConfig(cfg)
	cfg.QPS = float32(opts.KubeAPIQPS)
	cfg.Burst = opts.KubeAPIBurst
	if cfg.UserAgent == "" {
		cfg.UserAgent = "loom-manager"
	}
	countRequests(cfg)
	// rest_client_rate_limiter_duration_seconds: time requests waited for
	// the client's own QPS limit, so throttling by --kube-api-qps shows
	// apart from a slow API server.
	crmetrics.RegisterRESTClientMetrics(crmetrics.MetricRateLimiterLatency)

	mgr, err := ctrl.NewManager(cfg, ctrlOptions(opts))
	if err != nil {
		return nil, nil, fmt.Errorf("creating manager: %w", err)
	}

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, nil, err
	}
	if err := mgr.AddReadyzCheck("informers", cacheSynced(mgr.GetCache())); err != nil {
		return nil, nil, err
	}

	for _, name := range selected {
		if err := reg.setup(name)(ctx, mgr, opts); err != nil {
			return nil, nil, fmt.Errorf("setting up controller %s: %w", name, err)
		}
	}
	for name, off := range reg.unselected(selected) {
		if err := off(ctx, mgr, opts); err != nil {
			return nil, nil, fmt.Errorf("setting up controller %s's removal: %w", name, err)
		}
	}
	return mgr, selected, nil
}

// ctrlOptions are controller-runtime's options for opts: the shared cache
// (namespaces, trimmed objects), secured metrics, probes, leader election.
func ctrlOptions(opts Options) ctrl.Options {
	var cacheNamespaces map[string]cache.Config
	if len(opts.WatchNamespaces) > 0 {
		cacheNamespaces = map[string]cache.Config{}
		for _, ns := range ownNamespaces(opts) {
			cacheNamespaces[ns] = cache.Config{}
		}
	}
	leNamespace := opts.LeaderElectionNamespace
	if leNamespace == "" {
		leNamespace = opts.Namespace
	}

	var tlsOpts []func(*tls.Config)
	if !opts.EnableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	metricsOpts := metricsserver.Options{
		BindAddress:   opts.MetricsAddr,
		SecureServing: opts.MetricsSecure,
		CertDir:       opts.MetricsCertDir,
		TLSOpts:       tlsOpts,
	}
	if opts.MetricsSecure {
		metricsOpts.FilterProvider = metricsAuth
	}

	leaseDuration, renewDeadline, retryPeriod := opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod
	shutdown := opts.GracefulShutdownTimeout
	return ctrl.Options{
		Scheme:  Scheme(),
		Metrics: metricsOpts,
		Cache: cache.Options{
			DefaultNamespaces: cacheNamespaces,
			// managedFields are a large share of every cached object and no
			// reconciler reads them.
			DefaultTransform: cache.TransformStripManagedFields(),
			// Reconcilers own only Services they label; the cluster's
			// others (often thousands) stay out of memory.
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Service{}: {Label: ownedByLoom},
				// Likewise the kinds Loom only writes: a cluster's own
				// ConfigMaps, ServiceAccounts and DaemonSets (often
				// gigabytes of ConfigMaps) stay out of memory. Writers read
				// around the cache before a create, so a foreign object of
				// a child's name is still found and left alone.
				// ConfigMaps of Loom's own namespace are cached whole: the
				// ClusterPolicy reads the content of those it names.
				&corev1.ConfigMap{}:      configMapCache(opts),
				&corev1.ServiceAccount{}: {Label: ownedByLoom},
				&appsv1.DaemonSet{}:      {Label: ownedByLoom},
				// A RayCluster's dashboard Ingress: the cluster's other
				// Ingresses stay out of memory.
				&networkingv1.Ingress{}: {Label: ownedByLoom},
				// RayJob submitter Jobs: a cluster's other batch Jobs
				// (CI, cron) stay out of memory.
				&batchv1.Job{}: {Label: ownedByLoom},
				// Every pod of the cluster (the inventory counts their
				// GPUs), but only workloads' own pods in full; see TrimPod.
				&corev1.Pod{}: {Transform: TrimPod},
				// Typed Nodes only as the inventory reads them (GPU
				// allocatable, taints, Ready); Node metadata whole.
				&corev1.Node{}: {Transform: trimNode},
			},
		},
		HealthProbeBindAddress:        opts.ProbeAddr,
		PprofBindAddress:              opts.PprofAddr,
		LeaderElection:                opts.LeaderElect,
		LeaderElectionID:              opts.LeaderElectionID,
		LeaderElectionNamespace:       leNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &leaseDuration,
		RenewDeadline:                 &renewDeadline,
		RetryPeriod:                   &retryPeriod,
		GracefulShutdownTimeout:       &shutdown,
		Controller: config.Controller{
			MaxConcurrentReconciles: opts.MaxConcurrentReconciles,
			SkipNameValidation:      &opts.skipNameValidation,
		},
	}
}

// configMapCache caches every ConfigMap of Loom's namespace and Loom's own
// elsewhere (in the watched namespaces, or all of them).
func configMapCache(opts Options) cache.ByObject {
	if opts.Namespace == "" {
		return cache.ByObject{Label: ownedByLoom}
	}
	namespaces := map[string]cache.Config{}
	if len(opts.WatchNamespaces) == 0 {
		namespaces[cache.AllNamespaces] = cache.Config{LabelSelector: ownedByLoom}
	}
	if len(opts.WatchNamespaces) > 0 {
		for _, ns := range ownNamespaces(opts) {
			namespaces[ns] = cache.Config{LabelSelector: ownedByLoom}
		}
	}
	namespaces[opts.Namespace] = cache.Config{LabelSelector: labels.Everything()}
	return cache.ByObject{Namespaces: namespaces}
}

// ownNamespaces are the namespaces a --watch-namespaces cache covers: the
// ones named, plus Loom's own (the ClusterPolicy's operands, their
// ServiceAccounts and ConfigMaps) and the dashboards' one, which Loom
// reads and writes whatever the user's workloads' namespaces are.
func ownNamespaces(opts Options) []string {
	out := append([]string{}, opts.WatchNamespaces...)
	for _, ns := range []string{opts.Namespace, opts.DashboardsNamespace} {
		if ns != "" && !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out
}

// trimNode is the inventory's trimmed Node (inventory.TrimNode) plus the
// OS image, kernel, container runtime and kubelet versions of its
// nodeInfo: the ClusterPolicy picks the driver images by the first two,
// the containerd the toolkit configures by the others.
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return inventory.TrimNode(obj)
	}
	ni := n.Status.NodeInfo
	info := corev1.NodeSystemInfo{OSImage: ni.OSImage, KernelVersion: ni.KernelVersion,
		ContainerRuntimeVersion: ni.ContainerRuntimeVersion, KubeletVersion: ni.KubeletVersion}
	out, err := inventory.TrimNode(obj)
	if t, ok := out.(*corev1.Node); ok && err == nil {
		t.Status.NodeInfo = info
	}
	return out, err
}

// ownedByLoom selects the objects Loom labels as its own.
var ownedByLoom = labels.SelectorFromSet(labels.Set{apply.LabelManagedBy: apply.ManagedBy})

// cacheSynced reports ready once every informer the controllers asked for has
// synced. Replicas that are not the leader are ready too: their caches are
// warm, so a failover starts from a full view.
func cacheSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return fmt.Errorf("informer caches have not synced yet")
		}
		return nil
	}
}
