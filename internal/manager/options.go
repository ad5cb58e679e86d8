package manager

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Options are the manager's settings. BindFlags maps them to command-line
// flags; tests fill the struct directly.
type Options struct {
	// Controllers is the --controllers value (comma list, or all).
	Controllers string
	// WatchNamespaces restricts namespaced watches to these namespaces; empty
	// means every namespace. Cluster-scoped kinds are always watched.
	WatchNamespaces []string
	// Namespace is where Loom itself runs: its operands, its lease.
	Namespace string

	MetricsAddr    string
	MetricsSecure  bool
	MetricsCertDir string
	EnableHTTP2    bool
	ProbeAddr      string
	// PprofAddr serves net/http/pprof (heap profiles for the fleet
	// benchmark); empty or "0" turns it off.
	PprofAddr string

	LeaderElect             bool
	LeaderElectionID        string
	LeaderElectionNamespace string
	LeaseDuration           time.Duration
	RenewDeadline           time.Duration
	RetryPeriod             time.Duration
	GracefulShutdownTimeout time.Duration
	MaxConcurrentReconciles int
	KubeAPIQPS              float64
	KubeAPIBurst            int

	// GangScheduler is the gang scheduler of TrainingJobs and RayClusters
	// that do not name one: auto (Volcano for TrainingJobs when its CRDs are
	// served, otherwise none; RayClusters gang only when they ask, as with
	// KubeRay), volcano or none.
	GangScheduler string
	// Kueue integrates TrainingJobs labelled kueue.x-k8s.io/queue-name with
	// Kueue (Workloads, admission) once Kueue's CRDs are served; false
	// ignores the label.
	Kueue bool
	// KueueLabelKeysToCopy are the keys of the TrainingJob labels copied to
	// its Workload when it is created, as Kueue's
	// integrations.labelKeysToCopy does for Kueue's own jobs (Kueue does
	// not build an external framework's Workloads, so set both alike).
	KueueLabelKeysToCopy []string
	// KueueManageJobsWithoutQueueName holds the TrainingJobs that name no
	// LocalQueue (after the default LocalQueue's labelling) instead of
	// running them outside Kueue, as Kueue's manageJobsWithoutQueueName
	// does for its own jobs (Kueue does not manage an external framework's
	// jobs, so set both alike).
	KueueManageJobsWithoutQueueName bool
	// MaxWorkloadPods is the most pods one TrainingJob or RayCluster may
	// ask for; a bigger one is held with a condition saying so, so that one
	// object cannot exhaust the manager's memory or the cluster's API.
	MaxWorkloadPods int
	// InstallRayCRD applies KubeRay's RayCluster and RayJob CRDs when they
	// are absent (the raycluster and rayjob controllers, each its own).
	InstallRayCRD bool
	// ApplyCRDs applies Loom's own CRDs at start when the cluster's are
	// older than this build's (EnsureCRDs).
	ApplyCRDs bool
	// MonitoringLabels are set on every ServiceMonitor, PodMonitor and
	// PrometheusRule Loom writes, so that a Prometheus selects them (e.g.
	// release=kube-prometheus-stack). Empty: learned from the Prometheus
	// objects' selectors.
	MonitoringLabels map[string]string
	// MetricsServiceMonitor names the manager's metrics Service (in
	// Namespace, port https-metrics) that the monitoring controller writes
	// a ServiceMonitor for, owned by the Service, once the Prometheus
	// Operator's ServiceMonitor CRD is served; empty: none.
	MetricsServiceMonitor string
	// MetricsScrapeInterval is that ServiceMonitor's interval (empty: the
	// Prometheus's own).
	MetricsScrapeInterval string
	// MetricsServiceMonitorLabels are set on that ServiceMonitor beside
	// MonitoringLabels (and win over them); with neither, its labels are
	// learned like every monitor's.
	MetricsServiceMonitorLabels map[string]string
	// GrafanaDashboards writes the dashboards ConfigMap (label
	// grafana_dashboard=1) into DashboardsNamespace (default: Namespace).
	GrafanaDashboards   bool
	DashboardsNamespace string

	LogLevel  string
	LogFormat string

	// skipNameValidation lets one process build several managers (tests
	// restart them); controller-runtime otherwise refuses a controller name
	// it has seen.
	skipNameValidation bool
}

// ForTests returns o allowing several managers in one process.
func (o Options) ForTests() Options {
	o.skipNameValidation = true
	return o
}

// Defaults for the client rate limits. client-go's own (5 QPS, burst 10, and
// 20/30 in controller-runtime) would turn a 512-pod gang into a half-minute
// trickle; API Priority and Fairness on the server is the real guard.
const (
	DefaultKubeAPIQPS   = 300
	DefaultKubeAPIBurst = 600
)

// GangAuto is the default gang scheduler: Volcano where it is installed.
const GangAuto = "auto"

// DefaultMaxWorkloadPods bounds one workload's pods: far above any gang a
// GPU cluster runs today, far below what exhausts the manager.
const DefaultMaxWorkloadPods = 5000

// DefaultOptions returns the options with every default filled in.
func DefaultOptions() Options {
	return Options{
		Controllers:      "all",
		Namespace:        namespaceFromEnv(),
		MetricsAddr:      ":8443",
		MetricsSecure:    true,
		ProbeAddr:        ":8081",
		LeaderElect:      true,
		LeaderElectionID: "loom-manager",
		// A leader keeps renewing for 45 s, so an API server away for 30 s
		// (an upgrade, a restart) does not make it exit; the price is
		// failover: a standby takes over within 60 s of a leader's crash
		// (at once when the leader stops cleanly: it releases the lease).
		LeaseDuration:           60 * time.Second,
		RenewDeadline:           45 * time.Second,
		RetryPeriod:             5 * time.Second,
		GracefulShutdownTimeout: 30 * time.Second,
		MaxConcurrentReconciles: 4,
		KubeAPIQPS:              DefaultKubeAPIQPS,
		KubeAPIBurst:            DefaultKubeAPIBurst,
		GangScheduler:           GangAuto,
		Kueue:                   true,
		MaxWorkloadPods:         DefaultMaxWorkloadPods,
		InstallRayCRD:           true,
		ApplyCRDs:               true,
		GrafanaDashboards:       true,
		LogLevel:                "info",
		LogFormat:               "json",
	}
}

// namespaceFromEnv reads the namespace from the downward API (POD_NAMESPACE),
// then from the service account mount, and falls back to loom-system.
func namespaceFromEnv() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "loom-system"
}

// BindFlags registers the options as flags on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Controllers, "controllers", o.Controllers, "comma-separated controllers to run, or \"all\"")
	fs.Func("watch-namespaces", "comma-separated namespaces to watch for namespaced objects (default: all)", func(s string) error {
		o.WatchNamespaces = splitList(s)
		return nil
	})
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "namespace Loom runs in (default: $POD_NAMESPACE)")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, "address of the metrics endpoint; \"0\" disables it")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure, "serve metrics over HTTPS with Kubernetes authentication and authorization")
	fs.StringVar(&o.MetricsCertDir, "metrics-cert-dir", o.MetricsCertDir, "directory with tls.crt and tls.key for the metrics endpoint (default: self-signed)")
	fs.StringVar(&o.MetricsServiceMonitor, "metrics-service-monitor", o.MetricsServiceMonitor,
		"name of the manager's metrics Service in --namespace (port https-metrics) to write a ServiceMonitor for once the Prometheus Operator is installed (default: none)")
	fs.StringVar(&o.MetricsScrapeInterval, "metrics-scrape-interval", o.MetricsScrapeInterval, "scrape interval of the manager's ServiceMonitor (default: the Prometheus's)")
	fs.Func("metrics-service-monitor-labels", "comma-separated key=value labels for the manager's ServiceMonitor, beside --monitoring-labels", func(s string) error {
		l, err := parseLabels(s)
		o.MetricsServiceMonitorLabels = l
		return err
	})
	fs.BoolVar(&o.EnableHTTP2, "enable-http2", o.EnableHTTP2, "allow HTTP/2 on the metrics endpoint (off: HTTP/2 rapid-reset CVEs)")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", o.PprofAddr, "address of net/http/pprof; empty or \"0\" (default) turns it off")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", o.ProbeAddr, "address of /healthz and /readyz")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "elect a leader so that only one replica reconciles")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", o.LeaderElectionID, "name of the leader-election Lease")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "namespace of the leader-election Lease (default: --namespace)")
	fs.DurationVar(&o.LeaseDuration, "leader-election-lease-duration", o.LeaseDuration, "leader-election lease duration")
	fs.DurationVar(&o.RenewDeadline, "leader-election-renew-deadline", o.RenewDeadline, "leader-election renew deadline")
	fs.DurationVar(&o.RetryPeriod, "leader-election-retry-period", o.RetryPeriod, "leader-election retry period")
	fs.DurationVar(&o.GracefulShutdownTimeout, "graceful-shutdown-timeout", o.GracefulShutdownTimeout, "time given to controllers to finish on SIGTERM")
	fs.IntVar(&o.MaxConcurrentReconciles, "max-concurrent-reconciles", o.MaxConcurrentReconciles, "parallel reconciles per controller")
	fs.Float64Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "client-side rate limit of API requests per second")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "client-side burst of API requests")
	fs.IntVar(&o.MaxWorkloadPods, "max-workload-pods", o.MaxWorkloadPods, "most pods one TrainingJob or RayCluster may ask for; bigger ones are held with a condition")
	fs.BoolVar(&o.Kueue, "kueue", o.Kueue, "admit TrainingJobs labelled kueue.x-k8s.io/queue-name through Kueue once its CRDs are served (false: ignore the label)")
	fs.BoolVar(&o.KueueManageJobsWithoutQueueName, "kueue-manage-jobs-without-queue-name", o.KueueManageJobsWithoutQueueName,
		"hold TrainingJobs that name no Kueue LocalQueue instead of running them outside Kueue (set as Kueue's manageJobsWithoutQueueName)")
	fs.Func("kueue-label-keys-to-copy", "comma-separated keys of the TrainingJob labels copied to its Kueue Workload when it is created (set as Kueue's integrations.labelKeysToCopy)", func(s string) error {
		o.KueueLabelKeysToCopy = splitList(s)
		for _, k := range o.KueueLabelKeysToCopy {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				return fmt.Errorf("label key %q: %s", k, strings.Join(errs, "; "))
			}
		}
		return nil
	})
	fs.StringVar(&o.GangScheduler, "gang-scheduler", o.GangScheduler, "gang scheduler of TrainingJobs and RayClusters that name none: auto (Volcano when installed, for TrainingJobs), volcano or none")
	fs.BoolVar(&o.InstallRayCRD, "install-ray-crd", o.InstallRayCRD, "apply KubeRay's RayCluster and RayJob CRDs (server-side) when absent; one applied by someone else is left alone")
	fs.BoolVar(&o.ApplyCRDs, "apply-crds", o.ApplyCRDs, "at start, apply Loom's own CRDs (server-side) when the cluster's are older than this build's")
	fs.Func("monitoring-labels", "comma-separated key=value labels for Loom's ServiceMonitors, PodMonitors and PrometheusRules (default: learned from the Prometheus objects' selectors)", func(s string) error {
		l, err := parseLabels(s)
		o.MonitoringLabels = l
		return err
	})
	fs.BoolVar(&o.GrafanaDashboards, "grafana-dashboards", o.GrafanaDashboards, "write Loom's Grafana dashboards ConfigMap (label grafana_dashboard=1)")
	fs.StringVar(&o.DashboardsNamespace, "grafana-dashboards-namespace", o.DashboardsNamespace, "namespace of the dashboards ConfigMap, where Grafana's sidecar looks (default: --namespace)")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "log level: debug, info, warn, error, or a verbosity number (higher logs more)")
	fs.StringVar(&o.LogFormat, "log-format", o.LogFormat, "log format: json or text")
}

// Validate checks values that flags alone cannot.
func (o *Options) Validate() error {
	var errs []error
	if o.MaxConcurrentReconciles < 1 {
		errs = append(errs, fmt.Errorf("--max-concurrent-reconciles must be at least 1, got %d", o.MaxConcurrentReconciles))
	}
	if o.MaxWorkloadPods < 1 {
		errs = append(errs, fmt.Errorf("--max-workload-pods must be at least 1, got %d", o.MaxWorkloadPods))
	}
	if !(o.KubeAPIQPS > 0) { // NaN too
		errs = append(errs, fmt.Errorf("--kube-api-qps must be positive, got %v", o.KubeAPIQPS))
	}
	if o.KubeAPIBurst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-burst must be at least 1, got %d", o.KubeAPIBurst))
	}
	if o.LeaderElect && o.LeaderElectionID == "" {
		errs = append(errs, errors.New("--leader-election-id must not be empty when --leader-elect is on"))
	}
	if o.LeaderElect && (o.LeaseDuration <= o.RenewDeadline || o.RenewDeadline <= o.RetryPeriod || o.RetryPeriod <= 0) {
		errs = append(errs, fmt.Errorf("leader election needs lease-duration > renew-deadline > retry-period > 0, got %v, %v, %v",
			o.LeaseDuration, o.RenewDeadline, o.RetryPeriod))
	}
	if o.Namespace == "" {
		errs = append(errs, errors.New("--namespace must not be empty"))
	}
	errs = append(errs, o.validateNames()...)
	if _, err := ParseLogLevel(o.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if o.GangScheduler != GangAuto && o.GangScheduler != "volcano" && o.GangScheduler != "none" {
		errs = append(errs, fmt.Errorf("--gang-scheduler must be auto, volcano or none, got %q", o.GangScheduler))
	}
	if o.LogFormat != "json" && o.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("--log-format must be json or text, got %q", o.LogFormat))
	}
	// Whether a Service's name may start with a digit (the chart's for a
	// release "1gpu": 1gpu-loom-metrics) is the API server's to say
	// (RelaxedServiceNameValidation); refuse only what no Service is called.
	if o.MetricsServiceMonitor != "" && len(validation.IsDNS1123Label(o.MetricsServiceMonitor)) > 0 {
		errs = append(errs, fmt.Errorf("--metrics-service-monitor must name a Service, got %q", o.MetricsServiceMonitor))
	}
	if o.MetricsScrapeInterval != "" && !scrapeInterval.MatchString(o.MetricsScrapeInterval) {
		errs = append(errs, fmt.Errorf("--metrics-scrape-interval must be a Prometheus duration such as 30s or 1m30s, got %q", o.MetricsScrapeInterval))
	}
	return errors.Join(errs...)
}

// validateNames refuses a namespace or Lease name no object can have (a
// typo, "*", an upper-case letter): the manager would run watching or
// writing nothing there, or never take the lease, without a word.
func (o *Options) validateNames() []error {
	var errs []error
	namespaces := map[string][]string{"--namespace": {o.Namespace}, "--watch-namespaces": o.WatchNamespaces,
		"--leader-election-namespace": {o.LeaderElectionNamespace}, "--grafana-dashboards-namespace": {o.DashboardsNamespace}}
	for _, flag := range []string{"--namespace", "--watch-namespaces", "--leader-election-namespace", "--grafana-dashboards-namespace"} {
		for _, ns := range namespaces[flag] {
			if msgs := validation.IsDNS1123Label(ns); ns != "" && len(msgs) > 0 {
				errs = append(errs, fmt.Errorf("%s: %q is no namespace's name: %s", flag, ns, strings.Join(msgs, "; ")))
			}
		}
	}
	if msgs := validation.IsDNS1123Subdomain(o.LeaderElectionID); o.LeaderElect && o.LeaderElectionID != "" && len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--leader-election-id: %q is no Lease's name: %s", o.LeaderElectionID, strings.Join(msgs, "; ")))
	}
	return errs
}

// scrapeInterval is the Prometheus Operator's Duration, not zero.
var scrapeInterval = regexp.MustCompile(`^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$`)

// ParseLogLevel maps debug/info/warn/error or a verbosity number N (logr V(N))
// to a zap level.
func ParseLogLevel(s string) (zapcore.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return zapcore.DebugLevel, nil
	case "info", "":
		return zapcore.InfoLevel, nil
	case "warn", "warning":
		return zapcore.WarnLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err == nil && n >= 0 && fmt.Sprint(n) == s {
		return zapcore.Level(-n), nil
	}
	return 0, fmt.Errorf("--log-level must be debug, info, warn, error or a non-negative number, got %q", s)
}

// parseLabels reads key=value,key=value, checking each as a Kubernetes
// label.
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range splitList(s) {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok {
			return nil, fmt.Errorf("label %q: want key=value", kv)
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, fmt.Errorf("label key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, fmt.Errorf("label %s value %q: %s", k, v, strings.Join(errs, "; "))
		}
		out[k] = v
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
