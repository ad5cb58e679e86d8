package monitoring

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/inventory"
	"github.com/loom-dev/loom/internal/podset"
)

// The inventory as metrics, for the alerts that compare it with what
// dcgm-exporter reports (a GPU gone) and that carry the node agent's view
// (unhealthy GPUs, an agent that stopped collecting).
var (
	gpusDesc      = prometheus.NewDesc("loom_gpunode_gpus", "GPUs the node agent found through NVML.", []string{"node", "product"}, nil)
	unhealthyDesc = prometheus.NewDesc("loom_gpunode_unhealthy_gpus", "GPUs the node agent marks Unhealthy (0 when all are healthy).", []string{"node"}, nil)
	readyDesc     = prometheus.NewDesc("loom_gpunode_ready", "1 when the node agent's last inventory collection succeeded, else 0.", []string{"node"}, nil)
	// Only the nodes in their upgrade, as the other node states below.
	upgradeDesc = prometheus.NewDesc("loom_gpunode_driver_upgrade",
		"1 while the node is in a driver upgrade (cordoned for it: from wait-for-jobs-required to uncordon-required); absent otherwise.",
		[]string{"node"}, nil)
	nodeReadyDesc = prometheus.NewDesc("loom_gpunode_node_ready",
		"1 when the node's Ready condition is True, else 0 (NotReady, Unknown: its kubelet silent).", []string{"node"}, nil)
	// Only the nodes whose agent runs unprivileged, by configuration.
	unprivilegedDesc = prometheus.NewDesc("loom_gpunode_agent_unprivileged",
		"1 while the node agent runs unprivileged and cannot read the GPUs through NVML (GPUNode reason Unprivileged); absent otherwise.",
		[]string{"node"}, nil)
	// Only the nodes cordoned: a fleet's nodes are nearly all schedulable.
	unschedulableDesc = prometheus.NewDesc("loom_gpunode_unschedulable",
		"1 while the node is cordoned (spec.unschedulable: for maintenance, or by the driver upgrade); absent otherwise.", []string{"node"}, nil)
	// Only the operands not ready: one series per node and operand would
	// be ten per GPU node, nearly all of them saying "ready".
	operandNotReadyDesc = prometheus.NewDesc("loom_gpunode_operand_not_ready",
		"1 when the operand (component) has pods on the node and none is Ready; absent otherwise (all ready, or no pod there).",
		[]string{"node", "component"}, nil)
)

// upgrading are the driver upgrade states of a node taken out for its
// upgrade: its workloads drained, its driver and operands restarted. The
// node alerts (an agent not reporting, GPUs missing or unhealthy, an
// exporter down) hold their tongue meanwhile; upgrade-failed has its own.
var upgrading = []string{gpuv1alpha1.WaitForJobsRequired, gpuv1alpha1.PodDeletionRequired, gpuv1alpha1.DrainRequired,
	gpuv1alpha1.PodRestartRequired, gpuv1alpha1.ValidationRequired, gpuv1alpha1.UncordonRequired}

// inventoryCollector reads the GPUNodes, the Nodes' metadata and Loom's
// operand pods (of its namespace) from the cache at scrape time.
type inventoryCollector struct {
	cache atomic.Pointer[inventorySource]
}

type inventorySource struct {
	client.Reader
	namespace string
}

func (c *inventoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- gpusDesc
	ch <- unhealthyDesc
	ch <- readyDesc
	ch <- upgradeDesc
	ch <- nodeReadyDesc
	ch <- unschedulableDesc
	ch <- unprivilegedDesc
	ch <- operandNotReadyDesc
}

func (c *inventoryCollector) Collect(ch chan<- prometheus.Metric) {
	cp := c.cache.Load()
	if cp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var list gpuv1alpha1.GPUNodeList
	if err := cp.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	// Only GPUNodes whose Node exists, as the index counts them: one left
	// behind by a deleted node is no GPU missing and no agent silent.
	// (The cache's typed Nodes keep their labels and Ready condition.)
	nodes := &corev1.NodeList{}
	if err := cp.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	exists := make(map[string]bool, len(nodes.Items))
	inUpgrade, nodeReady, cordoned := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, n := range nodes.Items {
		exists[n.Name], cordoned[n.Name] = true, n.Spec.Unschedulable
		inUpgrade[n.Name] = slices.Contains(upgrading, n.Labels[gpuv1alpha1.LabelUpgradeState])
		nodeReady[n.Name] = inventory.NodeReady(&n)
	}
	for i := range list.Items {
		n := &list.Items[i]
		if !exists[n.Name] {
			continue
		}
		unhealthy := 0
		for _, g := range n.Status.GPUs {
			if g.Health.State == gpuv1alpha1.GPUUnhealthy {
				unhealthy++
			}
		}
		// Ready is False also when the collection succeeded and found a
		// GPU unhealthy: that is LoomGPUNodeUnhealthyGPUs's, not an agent
		// that does not report.
		// Unprivileged is Ready False by configuration: its own series.
		ready := 0.0
		r := meta.FindStatusCondition(n.Status.Conditions, gpuv1alpha1.ConditionReady)
		if r != nil && (r.Status == metav1.ConditionTrue || r.Reason == gpuv1alpha1.ReasonUnhealthyGPUs) {
			ready = 1
		}
		if r != nil && r.Status == metav1.ConditionFalse && r.Reason == gpuv1alpha1.ReasonUnprivileged {
			ch <- prometheus.MustNewConstMetric(unprivilegedDesc, prometheus.GaugeValue, 1, n.Name)
		}
		ch <- prometheus.MustNewConstMetric(gpusDesc, prometheus.GaugeValue, float64(n.Status.GPUCount), n.Name, n.Status.Product)
		ch <- prometheus.MustNewConstMetric(unhealthyDesc, prometheus.GaugeValue, float64(unhealthy), n.Name)
		ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, ready, n.Name)
		if inUpgrade[n.Name] {
			ch <- prometheus.MustNewConstMetric(upgradeDesc, prometheus.GaugeValue, 1, n.Name)
		}
		ch <- prometheus.MustNewConstMetric(nodeReadyDesc, prometheus.GaugeValue, one(nodeReady[n.Name]), n.Name)
		if cordoned[n.Name] {
			ch <- prometheus.MustNewConstMetric(unschedulableDesc, prometheus.GaugeValue, 1, n.Name)
		}
	}
	collectOperands(ctx, *cp, exists, ch)
}

// collectOperands reports each operand that has pods of Loom's on a node
// and none Ready there (the cache keeps their component and Ready
// condition, see manager.TrimPod): a node in a driver upgrade is left out of
// LoomGPUOperandNotReady only for its own operands, and a node whose
// driver pod is not ready yet (building the kernel module) out of
// LoomGPUNodeAgentNotReporting. Pods being deleted do not count.
func collectOperands(ctx context.Context, src inventorySource, exists map[string]bool, ch chan<- prometheus.Metric) {
	pods := &corev1.PodList{}
	if err := src.List(ctx, pods, client.InNamespace(src.namespace), client.MatchingLabels{apply.LabelManagedBy: apply.ManagedBy}, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	type key struct{ node, component string }
	ready := map[key]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		k := key{p.Spec.NodeName, p.Labels[gpuv1alpha1.LabelComponent]}
		if k.node == "" || k.component == "" || !exists[k.node] || p.DeletionTimestamp != nil {
			continue
		}
		ready[k] = ready[k] || podset.Ready(p)
	}
	for k, r := range ready {
		if !r {
			ch <- prometheus.MustNewConstMetric(operandNotReadyDesc, prometheus.GaugeValue, 1, k.node, k.component)
		}
	}
}

// one is 1 for true, 0 for false.
func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var (
	inventoryMetrics     = &inventoryCollector{}
	registerInventoryOne sync.Once
)

// registerInventoryMetrics registers the collector once per process and
// points it at the newest manager's cache (tests start several) and
// Loom's namespace, where its operands run.
func registerInventoryMetrics(c client.Reader, namespace string) {
	registerInventoryOne.Do(func() { ctrlmetrics.Registry.MustRegister(inventoryMetrics) })
	inventoryMetrics.cache.Store(&inventorySource{Reader: c, namespace: namespace})
}
