package apply

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// drift names a field the writer applies (u) that the cached child cur
// does not hold as applied, or is "" when cur holds every one of them. It
// is the writer's first look at a child it applied before a restart (or
// that another replica applied): the hash on the child says what was
// applied, drift whether it is still there.
//
// Only what the apply sets is compared: a field the server defaulted, a
// label or annotation another party added, status and the rest of the
// metadata are not the writer's. A map holds what was applied when it
// holds each applied key as applied (other keys are another party's,
// which the apply would leave); a list must be as long as the applied one
// and hold each applied item at its place. A zero (0, "") is what a typed
// object sends for a field it leaves unset (a Service port's targetPort),
// which the server defaults: it is not compared. A false is compared: a
// typed object sends one only for a field it sets (a *bool such as
// allowPrivilegeEscalation), and the server keeps what is set. A kind
// cached as metadata only has no fields to compare (the writer reads it
// whole first when it can).
func drift(cur client.Object, u *unstructured.Unstructured) string {
	var live map[string]any
	switch c := cur.(type) {
	case *metav1.PartialObjectMetadata:
		return ""
	case *unstructured.Unstructured:
		live = c.Object
	default:
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cur)
		if err != nil {
			return fmt.Sprintf("cannot be compared (%v)", err)
		}
		live = m
	}
	for k, v := range u.Object {
		switch k {
		case "apiVersion", "kind", "metadata", "status":
			continue
		}
		if path, ok := holds(v, live[k]); !ok {
			return k + path
		}
	}
	return ""
}

// holds reports whether have holds want, as drift describes; when it does
// not, path leads to the first field that differs (".spec.replicas",
// "[0].image"). Numbers compare by value, whatever their Go type.
func holds(want, have any) (path string, ok bool) {
	switch w := want.(type) {
	case nil:
		return "", true
	case map[string]any:
		h, _ := have.(map[string]any)
		for k, v := range w {
			if p, ok := holds(v, h[k]); !ok {
				return "." + k + p, false
			}
		}
		return "", true
	case []any:
		h, _ := have.([]any)
		if len(h) != len(w) {
			return "", false
		}
		for i := range w {
			if p, ok := holds(w[i], h[i]); !ok {
				return fmt.Sprintf("[%d]%s", i, p), false
			}
		}
		return "", true
	}
	if x, isNum := number(want); isNum {
		y, isNum := number(have)
		return "", x == 0 || isNum && x == y
	}
	return "", want == "" || want == have
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case float64:
		return n, true
	case int:
		return float64(n), true
	case int32:
		return float64(n), true
	}
	return 0, false
}
