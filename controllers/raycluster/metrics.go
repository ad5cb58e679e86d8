package raycluster

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// KubeRay's RayCluster metrics, by KubeRay's names, help and labels
// (ray-operator/controllers/ray/metrics), so that dashboards and alerts
// built on KubeRay's keep working. Implemented here: KubeRay's collector
// lists every RayCluster, those another controller manages included.
var (
	provisionedDuration = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kuberay_cluster_provisioned_duration_seconds",
		Help: "The time, in seconds, when a RayCluster's `RayClusterProvisioned` status transitions from false (or unset) to true",
	}, []string{"name", "namespace", "uid"})
	clusterInfoDesc = prometheus.NewDesc("kuberay_cluster_info",
		"Metadata information about RayCluster custom resources", []string{"name", "namespace", "uid", "owner_kind"}, nil)
	conditionProvisionedDesc = prometheus.NewDesc("kuberay_cluster_condition_provisioned",
		"Indicates whether the RayCluster is provisioned", []string{"name", "namespace", "uid", "condition"}, nil)
)

// clustersCollector reports kuberay_cluster_info and
// kuberay_cluster_condition_provisioned for the RayClusters Loom
// reconciles, from the cache at scrape time: nothing to go stale. The
// cache is the latest manager's (a test process starts several).
type clustersCollector struct {
	mu    sync.Mutex
	cache client.Reader
}

func (c *clustersCollector) set(r client.Reader) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cache = r
}

func (c *clustersCollector) reader() client.Reader {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cache
}

func (c *clustersCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- clusterInfoDesc
	ch <- conditionProvisionedDesc
}

func (c *clustersCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.reader()
	if r == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var list rayv1.RayClusterList
	if err := r.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	for i := range list.Items {
		rc := &list.Items[i]
		if !reconciled(rc) {
			continue
		}
		owner := "None"
		if v, ok := rc.Labels[utils.RayOriginatedFromCRDLabelKey]; ok {
			owner = v
		}
		ch <- prometheus.MustNewConstMetric(clusterInfoDesc, prometheus.GaugeValue, 1, rc.Name, rc.Namespace, string(rc.UID), owner)
		provisioned := meta.IsStatusConditionTrue(rc.Status.Conditions, string(rayv1.RayClusterProvisioned))
		ch <- prometheus.MustNewConstMetric(conditionProvisionedDesc, prometheus.GaugeValue, 1, rc.Name, rc.Namespace, string(rc.UID), strconv.FormatBool(provisioned))
	}
}

// reconciled: Loom reconciles the cluster (no other spec.managedBy).
func reconciled(rc *rayv1.RayCluster) bool {
	return rc.Spec.ManagedBy == nil || *rc.Spec.ManagedBy == "" || *rc.Spec.ManagedBy == utils.KubeRayController
}

// observeProvisioned sets kuberay_cluster_provisioned_duration_seconds
// when the status written (over was) makes RayClusterProvisioned True, as
// KubeRay does: the time since the cluster's creation.
func observeProvisioned(rc *rayv1.RayCluster, was, written *rayv1.RayClusterStatus, now time.Time) {
	t := string(rayv1.RayClusterProvisioned)
	if meta.IsStatusConditionTrue(was.Conditions, t) || !meta.IsStatusConditionTrue(written.Conditions, t) {
		return
	}
	provisionedDuration.WithLabelValues(rc.Name, rc.Namespace, string(rc.UID)).Set(now.Sub(rc.CreationTimestamp.Time).Seconds())
}

// forgetMetrics drops a deleted cluster's duration, as KubeRay does.
func forgetMetrics(key client.ObjectKey) {
	provisionedDuration.DeletePartialMatch(prometheus.Labels{"name": key.Name, "namespace": key.Namespace})
}

var (
	registerOnce sync.Once
	clusters     = &clustersCollector{}
)

// registerMetrics registers the RayCluster metrics in controller-runtime's
// registry once per process, the collector reading cache.
func registerMetrics(cache client.Reader) {
	clusters.set(cache)
	registerOnce.Do(func() {
		ctrlmetrics.Registry.MustRegister(provisionedDuration, clusters)
	})
}
