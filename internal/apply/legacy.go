// Legacy writers, removed once every reconciler writes through Writer.
package apply

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// legacyForeign are the condition types a legacy status write leaves alone:
// the monitoring reconcilers' (controllers/monitoring owns them). A Writer
// needs no such list: it applies only its Options.Conditions.
var legacyForeign = []string{"Monitoring", "loom.dev/Monitoring"}

// Status server-side applies status as obj's status under fieldOwner,
// leaving out the conditions other reconcilers write. Conditions are a map
// by type, so a condition another field owner applied survives this write
// even when the writer's cached copy of obj predates it (a JSON merge patch
// would replace the whole list). Fields the writer no longer sets are
// removed, as with any apply.
func Status(ctx context.Context, c client.Client, obj client.Object, status any, fieldOwner string) error {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return err
	}
	dropNulls(m)
	if conds, ok := m["conditions"].([]any); ok {
		m["conditions"] = slices.DeleteFunc(conds, func(c any) bool {
			t, _ := c.(map[string]any)["type"].(string)
			return slices.Contains(legacyForeign, t)
		})
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": m}}
	u.SetGroupVersionKind(gvk)
	u.SetName(obj.GetName())
	u.SetNamespace(obj.GetNamespace())
	return c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(fieldOwner), client.ForceOwnership)
}
