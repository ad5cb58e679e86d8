package monitoring

import (
	"context"
	"errors"
	"slices"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"

	gpuv1alpha1 "github.com/loom-dev/loom/apis/gpu/v1alpha1"
	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/manager"
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
// --metrics-service-monitor-labels), or those learned. Served securely,
// a Prometheus that denies file access through ServiceMonitors selects
// it but does not load it (fileAccessDenied).
func (r *GPUReconciler) managerSelection(o gpuObserved) Selection {
	s := Select(o.proms, Object{Kind: KindServiceMonitor, Namespace: r.Namespace, Labels: ownedLabels(componentManager)},
		r.ManagerLabels, func(string) map[string]string { return o.nsLabels })
	if r.Manager.Secure {
		s = fileAccessDenied(o.proms, s)
	}
	return s
}

// fileAccessDenied moves out of s.SelectedBy each Prometheus (or agent)
// with arbitraryFSAccessThroughSMs.deny: the Prometheus Operator rejects
// a ServiceMonitor with a bearerTokenFile there, and the manager's has
// one. A ServiceMonitor has no other way to send Prometheus's own service
// account token, which the metrics endpoint authenticates: its
// authorization and bearerTokenSecret read a Secret, a token that
// Prometheus's identity does not rotate; only a scrape class of the
// Prometheus (authorization.credentialsFile) does, and it is the
// Prometheus owner's to define.
func fileAccessDenied(proms []*monitoringv1.Prometheus, s Selection) Selection {
	for _, p := range proms {
		if !p.Spec.ArbitraryFSAccessThroughSMs.Deny || !slices.Contains(s.SelectedBy, ref(p)) {
			continue
		}
		s.SelectedBy = slices.DeleteFunc(slices.Clone(s.SelectedBy), func(by string) bool { return by == ref(p) })
		s.Why = append(s.Why, ref(p)+": its arbitraryFSAccessThroughSMs.deny rejects the ServiceMonitor, whose bearerTokenFile "+
			"sends Prometheus's own service account token to the manager's authenticated metrics endpoint; allow it there, "+
			"or scrape the manager with a ServiceMonitor of your own (metrics.serviceMonitor.enabled false)")
	}
	return s
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
	if !loomsManagerMonitor(cur) {
		return nil
	}
	return r.writer.Delete(ctx, cur, "the manager's metrics are no longer scraped")
}

// loomsManagerMonitor: cur is the manager's ServiceMonitor as Loom wrote
// it, not being deleted.
func loomsManagerMonitor(cur *monitoringv1.ServiceMonitor) bool {
	l := cur.Labels
	return l[apply.LabelManagedBy] == apply.ManagedBy && l[gpuv1alpha1.LabelComponent] == componentManager && cur.DeletionTimestamp == nil
}

// Off is what a manager run without the monitoring controller does: once,
// as the leader, it deletes the manager's ServiceMonitor that an earlier
// run of the controller wrote. Nothing else would (it goes with the metrics
// Service, at uninstall), and the chart renders its own when the controller
// is left out: the manager would be scraped twice, its series duplicated.
// A ServiceMonitor of that name that is not Loom's, or a cluster without
// the Prometheus Operator's CRDs, is left as it is; a failed read or
// delete is logged, never fatal.
func Off(_ context.Context, mgr ctrl.Manager, opts manager.Options) error {
	if opts.Namespace == "" {
		return nil
	}
	return mgr.Add(ctrlmanager.RunnableFunc(func(ctx context.Context) error {
		if err := removeLeftManagerMonitor(ctx, mgr.GetAPIReader(), mgr.GetClient(), opts.Namespace); err != nil {
			ctrl.Log.WithName("monitoring").Error(err, "removing the manager's ServiceMonitor left by an earlier run of the monitoring controller")
		}
		return nil
	}))
}

// removeLeftManagerMonitor deletes Loom's manager ServiceMonitor in
// namespace, read around the cache (which has no ServiceMonitors without
// the monitoring controller).
func removeLeftManagerMonitor(ctx context.Context, r client.Reader, c client.Client, namespace string) error {
	cur := &monitoringv1.ServiceMonitor{}
	err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ManagerServiceMonitorName}, cur)
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil
	}
	if err != nil || !loomsManagerMonitor(cur) {
		return err
	}
	err = c.Delete(ctx, cur, client.Preconditions{UID: &cur.UID})
	if err == nil {
		ctrl.Log.WithName("monitoring").Info("deleted the manager's ServiceMonitor: the monitoring controller is off", "serviceMonitor", namespace+"/"+ManagerServiceMonitorName)
	}
	return client.IgnoreNotFound(err)
}
