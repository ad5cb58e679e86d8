package apply

import (
	"testing"
)

func TestDropNulls(t *testing.T) {
	m := map[string]any{"a": nil, "h": map[string]any(nil), "i": []any(nil), "j": map[string]any{"k": map[string]any{}}, "b": map[string]any{"c": nil, "d": 1}, "e": []any{map[string]any{"f": nil, "g": "x"}}}
	dropNulls(m)
	for _, k := range []string{"a", "h", "i", "j"} {
		if _, ok := m[k]; ok {
			t.Errorf("null %s kept", k)
		}
	}
	if _, ok := m["b"].(map[string]any)["c"]; ok {
		t.Error("nested null kept")
	}
	if _, ok := m["e"].([]any)[0].(map[string]any)["f"]; ok {
		t.Error("null in a list item kept")
	}
	if m["b"].(map[string]any)["d"] != 1 || m["e"].([]any)[0].(map[string]any)["g"] != "x" {
		t.Errorf("values lost: %v", m)
	}
}
