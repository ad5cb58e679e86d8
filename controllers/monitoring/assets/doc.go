// Package assets is what Loom ships for Prometheus and Grafana, as pure Go:
// dcgm-exporter's counters file, the GPU recording rules and alerts, and the
// Grafana dashboards.
//
// The rules and dashboards read the series as Loom's ServiceMonitor scrapes
// dcgm-exporter (job ExporterJob, honorLabels): every DCGM series has node
// (the exporter pod's node), gpu, UUID, modelName and Hostname; a MIG device
// adds GPU_I_PROFILE and GPU_I_ID; a GPU allocated to a pod has that pod's
// namespace, pod and container, a free GPU none of them. Loom's manager
// exports loom_gpunode_gpus{node,product}, loom_gpunode_unhealthy_gpus{node}
// and loom_gpunode_ready{node} from its inventory, and the loom_clusterpolicy_*,
// loom_driver_upgrade_nodes and loom_trainingjobs metrics.
//
// The rules are evaluated with Prometheus's engine in ruletest/, a module of
// its own (see there).
package assets
