package monitoring

import (
	"context"
	"errors"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/loom-dev/loom/internal/apply"
	"github.com/loom-dev/loom/internal/optional"
)

// FieldOwner is the monitoring reconcilers' server-side apply field owner,
// for their children and for their one condition on the objects they
// onboard (conditions are a map by type, so the condition is theirs alone).
const FieldOwner = "loom-monitoring"

// Condition types the monitoring reconcilers own: one on each object they
// onboard, written by them alone beside the owner reconciler's conditions.
// ClusterPolicies and TrainingJobs carry Monitoring; RayClusters carry
// KubeRay's condition types, so Loom's own is prefixed.
const (
	ConditionMonitoring    = "Monitoring"
	RayConditionMonitoring = "loom.dev/Monitoring"

	ReasonSelected         = "Selected"
	ReasonNotSelected      = "NotSelected"
	ReasonNoPrometheus     = "NoPrometheus"
	ReasonWritten          = "Written"
	ReasonOperatorMissing  = "PrometheusOperatorMissing"
	ReasonOptedOut         = "OptedOut"
	ReasonNoMetricsPort    = "NoMetricsPort"
	ReasonExporterDisabled = "ExporterDisabled"
	ReasonConflict         = "NameConflict"
	ReasonApplyFailed      = "ApplyFailed"
)

// operatorCRDs are the Prometheus Operator's CRDs a controller uses, with
// the watch each starts once served. Each kind is used as soon as its own
// CRD is served, whatever the others.
type operatorCRDs []*optional.Kind

func crdKind(plural string, gvk schema.GroupVersionKind, watch func() error) *optional.Kind {
	return &optional.Kind{CRD: plural + "." + gvk.Group, GVK: gvk, Watch: watch}
}

// missing returns, by kind, the CRDs not installed, or terminating (the
// Prometheus Operator being uninstalled: the API server deletes their
// objects and refuses every create until the CRD is gone); an error
// (optional's ErrNotServedYet among them) means "ask again shortly".
func (ks operatorCRDs) missing(ctx context.Context, c client.Client) (crdsMissing, error) {
	out := crdsMissing{}
	for _, k := range ks {
		ok, err := k.Served(ctx, c)
		if err != nil {
			return nil, err
		}
		if ok {
			crd := &metav1.PartialObjectMetadata{}
			crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
			if err := c.Get(ctx, client.ObjectKey{Name: k.CRD}, crd); err != nil {
				return nil, client.IgnoreNotFound(err)
			}
			ok = crd.DeletionTimestamp == nil
		}
		if !ok {
			out[k.GVK.Kind] = k.CRD
		}
	}
	return out, nil
}

// crdsMissing names, by kind, the Prometheus Operator CRDs not installed.
type crdsMissing map[string]string

// has reports whether kind's CRD is installed.
func (m crdsMissing) has(kind string) bool {
	_, missing := m[kind]
	return !missing
}

// of names the missing CRDs among kinds'.
func (m crdsMissing) of(kinds ...string) []string {
	var out []string
	for _, k := range kinds {
		if crd, ok := m[k]; ok {
			out = append(out, crd)
		}
	}
	return out
}

// prometheusesReadable reports whether a kind that selects monitors is
// served, so that their selection can be checked.
func (m crdsMissing) prometheusesReadable() bool {
	return m.has(monitoringv1.PrometheusesKind) || m.has(KindPrometheusAgent)
}

// observeResult is a reconcile's answer when its observation ends it: a
// Prometheus Operator or workload CRD just created and not served yet is
// asked about again in a second; other errors are retried.
func observeResult(err error) (ctrl.Result, error) {
	if errors.Is(err, optional.ErrNotServedYet) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{}, err
}

// writeChildren makes the children match through w: ensure those wanted
// and remove Loom's of the names no longer wanted, all controlled by owner.
// A name taken by an object Loom does not control is returned apart (it
// needs a person and goes into the condition); other errors are joined.
func writeChildren(ctx context.Context, w *apply.Writer, owner client.Object, ensure, remove []client.Object) (*apply.ForeignError, error) {
	var conflict *apply.ForeignError
	var errs []error
	for _, want := range ensure {
		err := w.Ensure(ctx, owner, want)
		var f *apply.ForeignError
		if errors.As(err, &f) {
			conflict = f
			continue
		}
		errs = append(errs, err)
	}
	for _, obj := range remove {
		errs = append(errs, w.Remove(ctx, owner, obj))
	}
	return conflict, errors.Join(errs...)
}

// conditionStatus is all of an onboarded object's status the monitoring
// reconcilers write: their one condition.
type conditionStatus struct {
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// conditionChange is the status write of cond onto an object of generation
// generation whose conditions are conds: old holds the object's current
// condition of cond's type only (none: empty), want cond, which keeps the
// old transition time while its status stays. They are equal when nothing
// changed, and the writer then writes nothing.
func conditionChange(conds []metav1.Condition, cond metav1.Condition, generation int64, now time.Time) (old, want *conditionStatus) {
	cond.Message = apply.TruncateMessage(cond.Message) // selectors can be long
	cond.ObservedGeneration = generation
	cond.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
	old = &conditionStatus{}
	if cur := meta.FindStatusCondition(conds, cond.Type); cur != nil {
		old.Conditions = []metav1.Condition{*cur}
		if cur.Status == cond.Status {
			cond.LastTransitionTime = cur.LastTransitionTime
		}
	}
	return old, &conditionStatus{Conditions: []metav1.Condition{cond}}
}

// writeCondition writes cond onto obj through w, whose Options.Conditions
// name cond's type; conds are obj's current conditions. An object deleted
// meanwhile is not an error.
func writeCondition(ctx context.Context, w *apply.Writer, obj client.Object, conds []metav1.Condition, cond metav1.Condition) error {
	old, want := conditionChange(conds, cond, obj.GetGeneration(), time.Now())
	_, err := w.Status(ctx, obj, old, want)
	return client.IgnoreNotFound(err)
}

// applyFailedCondition reports a write of the children the API server
// refused (a quota on monitors, an admission policy): the condition says
// so while the write is retried.
func applyFailedCondition(conditionType string, err error) metav1.Condition {
	return metav1.Condition{Type: conditionType, Status: metav1.ConditionFalse, Reason: ReasonApplyFailed,
		Message: "writing the monitoring objects failed, retrying: " + err.Error()}
}

// conflictCondition reports a child's name taken by an object Loom does not
// control.
func conflictCondition(conditionType string, f *apply.ForeignError) metav1.Condition {
	return metav1.Condition{Type: conditionType, Status: metav1.ConditionFalse, Reason: ReasonConflict, Message: f.Error()}
}
