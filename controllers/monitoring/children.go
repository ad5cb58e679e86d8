package monitoring

import (
	"context"
	"fmt"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/optional"
)

// FieldOwner is the monitoring reconcilers' server-side apply field owner,
// for their children and for their one condition on the objects they
// onboard (conditions are a map by type, so the condition is theirs alone).
const FieldOwner = "loom-monitoring"

// Condition types the monitoring reconcilers own. RayClusters carry
// KubeRay's condition types, so Loom's own are prefixed.
const (
	ConditionMonitoring    = apply.ConditionMonitoring
	RayConditionMonitoring = apply.RayConditionMonitoring

	ReasonSelected         = "Selected"
	ReasonNotSelected      = "NotSelected"
	ReasonNoPrometheus     = "NoPrometheus"
	ReasonOperatorMissing  = "PrometheusOperatorMissing"
	ReasonOptedOut         = "OptedOut"
	ReasonNoMetricsPort    = "NoMetricsPort"
	ReasonExporterDisabled = "ExporterDisabled"
	ReasonConflict         = "NameConflict"
)

// operatorCRDs are the Prometheus Operator's CRDs a controller needs, with
// the watch each starts once served.
type operatorCRDs []*optional.Kind

func crdKind(plural, kind string, watch func() error) *optional.Kind {
	return &optional.Kind{CRD: plural + "." + monitoringv1.SchemeGroupVersion.Group, GVK: monitoringv1.SchemeGroupVersion.WithKind(kind), Watch: watch}
}

// missing returns the CRDs not yet installed; an error (optional's
// ErrNotServedYet among them) means "ask again shortly".
func (ks operatorCRDs) missing(ctx context.Context, c client.Client) ([]string, error) {
	var out []string
	for _, k := range ks {
		ok, err := k.Served(ctx, c)
		if err != nil {
			return nil, err
		}
		if !ok {
			out = append(out, k.CRD)
		}
	}
	return out, nil
}

// errConflict: an object of the child's name exists and is not Loom's.
type errConflict struct{ kind, key string }

func (e errConflict) Error() string {
	return fmt.Sprintf("%s %s exists and is not managed by Loom (label %s=%s); Loom leaves it alone", e.kind, e.key, LabelManagedBy, managedBy)
}

// ensure makes the child named like want (or key, when want is nil) match
// want, comparing with the cache so that a steady cluster costs no writes;
// want nil removes Loom's child. cur is an empty object of the child's type.
func ensure(ctx context.Context, c client.Client, cur client.Object, key client.ObjectKey, want client.Object, owner metav1.OwnerReference) error {
	err := c.Get(ctx, key, cur)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	exists := err == nil
	ours := exists && cur.GetLabels()[LabelManagedBy] == managedBy
	if want == nil {
		if ours && cur.GetDeletionTimestamp() == nil {
			return client.IgnoreNotFound(c.Delete(ctx, cur))
		}
		return nil
	}
	if exists && !ours {
		return errConflict{kind: fmt.Sprintf("%T", cur)[len("*"):], key: key.String()}
	}
	want.SetOwnerReferences([]metav1.OwnerReference{owner})
	if exists && cur.GetDeletionTimestamp() == nil && controlledBy(cur, owner) && hasLabels(cur, want.GetLabels()) && sameContent(cur, want) {
		return nil
	}
	_, err = apply.Apply(ctx, c, want, FieldOwner)
	return err
}

func controlledBy(o client.Object, owner metav1.OwnerReference) bool {
	ref := metav1.GetControllerOf(o)
	return ref != nil && ref.UID == owner.UID && len(o.GetOwnerReferences()) == 1
}

func hasLabels(o client.Object, want map[string]string) bool {
	have := o.GetLabels()
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	// Selection labels Loom set earlier and no longer wants must go too.
	for k := range have {
		if _, ok := want[k]; !ok && k != LabelManagedBy {
			return false
		}
	}
	return true
}

// sameContent compares what Loom sets of each kind of child.
func sameContent(cur, want client.Object) bool {
	switch w := want.(type) {
	case *corev1.Service:
		c := cur.(*corev1.Service)
		return c.Spec.ClusterIP == w.Spec.ClusterIP && apiequality.Semantic.DeepEqual(c.Spec.Selector, w.Spec.Selector) &&
			apiequality.Semantic.DeepEqual(c.Spec.Ports, w.Spec.Ports)
	case *corev1.ConfigMap:
		return apiequality.Semantic.DeepEqual(cur.(*corev1.ConfigMap).Data, w.Data)
	case *monitoringv1.ServiceMonitor:
		return apiequality.Semantic.DeepEqual(cur.(*monitoringv1.ServiceMonitor).Spec, w.Spec)
	case *monitoringv1.PodMonitor:
		return apiequality.Semantic.DeepEqual(cur.(*monitoringv1.PodMonitor).Spec, w.Spec)
	case *monitoringv1.PrometheusRule:
		return apiequality.Semantic.DeepEqual(cur.(*monitoringv1.PrometheusRule).Spec, w.Spec)
	}
	return false
}

// setCondition writes cond onto obj's status with server-side apply, only
// when its status, reason, message or generation changed. conds are obj's
// current conditions.
func setCondition(ctx context.Context, c client.Client, obj client.Object, gvk schema.GroupVersionKind, conds []metav1.Condition, cond metav1.Condition) error {
	cond.ObservedGeneration = obj.GetGeneration()
	cond.LastTransitionTime = metav1.NewTime(time.Now().Truncate(time.Second))
	if old := meta.FindStatusCondition(conds, cond.Type); old != nil {
		if old.Status == cond.Status && old.Reason == cond.Reason && old.Message == cond.Message && old.ObservedGeneration == cond.ObservedGeneration {
			return nil
		}
		if old.Status == cond.Status {
			cond.LastTransitionTime = old.LastTransitionTime
		}
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	u.SetName(obj.GetName())
	u.SetNamespace(obj.GetNamespace())
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&cond)
	if err != nil {
		return err
	}
	u.Object["status"] = map[string]any{"conditions": []any{m}}
	if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("writing the %s condition: %w", cond.Type, err)
	}
	return nil
}
