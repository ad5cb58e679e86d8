package apply

import "testing"

func TestHolds(t *testing.T) {
	for _, tc := range []struct {
		name       string
		want, have any
		path       string
		ok         bool
	}{
		{"nothing wanted", nil, map[string]any{"a": "b"}, "", true},
		{"equal string", "a", "a", "", true},
		{"other string", "a", "b", "", false},
		{"missing scalar", "a", nil, "", false},
		{"scalar of another type", "1", int64(1), "", false},
		{"numbers by value", map[string]any{"n": 4}, map[string]any{"n": int64(4)}, "", true},
		{"float and int", int64(2), float64(2), "", true},
		{"other number", int64(2), int64(3), "", false},
		{"bool", true, false, "", false},
		{"zero sent for a field left unset, the server defaulted it", map[string]any{"targetPort": int64(0), "name": ""},
			map[string]any{"targetPort": int64(6379), "name": "gcs"}, "", true},
		{"an applied false edited to true", map[string]any{"allowPrivilegeEscalation": false},
			map[string]any{"allowPrivilegeEscalation": true}, ".allowPrivilegeEscalation", false},
		{"an applied false removed", map[string]any{"privileged": false}, map[string]any{}, ".privileged", false},
		{"keys another party added", map[string]any{"a": "1"}, map[string]any{"a": "1", "b": "2"}, "", true},
		{"a key changed", map[string]any{"a": "1", "b": "2"}, map[string]any{"a": "1", "b": "3"}, ".b", false},
		{"a key removed", map[string]any{"a": "1"}, map[string]any{}, ".a", false},
		{"empty map wanted, none there", map[string]any{"r": map[string]any{}}, map[string]any{}, "", true},
		{"defaults inside list items", []any{map[string]any{"name": "c"}}, []any{map[string]any{"name": "c", "imagePullPolicy": "Always"}}, "", true},
		{"an item added", []any{"--a"}, []any{"--a", "--b"}, "", false},
		{"an item removed", []any{"--a", "--b"}, []any{"--a"}, "", false},
		{"empty list wanted, none there", []any{}, nil, "", true},
		{"deep path", map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "a"}}}},
			map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "b"}}}}, ".spec.containers[0].image", false},
		{"a list where a map was", map[string]any{"a": "1"}, []any{"a"}, ".a", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, ok := holds(tc.want, tc.have)
			if ok != tc.ok || path != tc.path {
				t.Errorf("holds(%v, %v) = %q, %v; want %q, %v", tc.want, tc.have, path, ok, tc.path, tc.ok)
			}
		})
	}
}
