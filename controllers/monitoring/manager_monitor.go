package monitoring

import (
	"context"
	"errors"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
)

// The manager's own ServiceMonitor scrapes the metrics Loom's GPU alerts
// are built on (the inventory, nodes in a driver upgrade or down) and the
// manager's alerts read. It is owned by the manager's metrics Service, not
// by the policy: it is written with or without a ClusterPolicy, and goes
// with the Service (the chart's release) by garbage collection.

// managerService reads the manager's metrics Service around the cache
// (which holds only Loom's Services); nil when it does not exist.
func (r *GPUReconciler) managerService(ctx context.Context) (*metav1.PartialObjectMetadata, error) {
	svc := &metav1.PartialObjectMetadata{}
	gvk := corev1.SchemeGroupVersion.WithKind("Service")
	svc.SetGroupVersionKind(gvk)
	if err := r.live.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Manager.Service}, svc); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	svc.SetGroupVersionKind(gvk)
	return svc, nil
}

// managerSelection is the manager's ServiceMonitor's selection: its
// configured labels (--monitoring-labels and
// --metrics-service-monitor-labels), or those learned.
func (r *GPUReconciler) managerSelection(o gpuObserved) Selection {
	return Select(o.proms, Object{Kind: KindServiceMonitor, Namespace: r.Namespace, Labels: ownedLabels(componentManager)},
		r.ManagerLabels, func(string) map[string]string { return o.nsLabels })
}

// writeManagerMonitor makes the manager's ServiceMonitor match, once the
// ServiceMonitor CRD is served: ensured, owned by the metrics Service,
// while one is to be scraped and exists; Loom's removed when none is to be
// scraped. A name taken by an object Loom does not control is returned
// apart.
func (r *GPUReconciler) writeManagerMonitor(ctx context.Context, o gpuObserved) (*apply.ForeignError, error) {
	if !o.missing.has(KindServiceMonitor) {
		return nil, nil
	}
	if r.Manager.Service == "" {
		return nil, r.removeManagerMonitor(ctx)
	}
	if o.metricsService == nil {
		return nil, nil // garbage collected with it; written when it comes
	}
	err := r.writer.Ensure(ctx, o.metricsService, ManagerServiceMonitor(r.Namespace, r.Manager, r.managerSelection(o).Labels))
	var f *apply.ForeignError
	if errors.As(err, &f) {
		return f, nil
	}
	return nil, err
}

// removeManagerMonitor deletes the manager's ServiceMonitor if it is
// Loom's (the chart's own, metrics.serviceMonitor.enabled true, is not).
func (r *GPUReconciler) removeManagerMonitor(ctx context.Context) error {
	cur := &monitoringv1.ServiceMonitor{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: ManagerServiceMonitorName}, cur); err != nil {
		return client.IgnoreNotFound(err)
	}
	l := cur.Labels
	if l[apply.LabelManagedBy] != apply.ManagedBy || l[gpuv1alpha1.LabelComponent] != componentManager || cur.DeletionTimestamp != nil {
		return nil
	}
	return r.writer.Delete(ctx, cur, "the manager's metrics are no longer scraped")
}
