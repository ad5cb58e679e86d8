// Command crdtrim drops the descriptions from the embedded pod templates of
// a generated CRD. A PodTemplateSpec's documented schema is about 600 KB, two
// of them would push the TrainingJob CRD near etcd's 1.5 MB object limit, and
// `kubectl explain pod.spec` documents those fields already. Loom's own
// fields keep their descriptions.
//
//	go run ./hack/crdtrim FILE.yaml...
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	for _, path := range os.Args[1:] {
		if err := trim(path); err != nil {
			fmt.Fprintf(os.Stderr, "crdtrim: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

func trim(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd map[string]any
	if err := yaml.Unmarshal(b, &crd); err != nil {
		return err
	}
	walk(crd, false, false)
	out, err := yaml.Marshal(crd)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte("---\n"), out...), 0o644)
}

// walk removes "description" keys inside any "template" property (the
// embedded PodTemplateSpecs), keeping the template's own.
func walk(v any, trimSelf, trimBelow bool) {
	switch t := v.(type) {
	case map[string]any:
		if trimSelf {
			if _, ok := t["description"].(string); ok {
				delete(t, "description")
			}
		}
		for k, child := range t {
			if k == "properties" {
				if props, ok := child.(map[string]any); ok {
					for name, p := range props {
						walk(p, trimBelow, trimBelow || name == "template")
					}
					continue
				}
			}
			walk(child, trimBelow, trimBelow)
		}
	case []any:
		for _, child := range t {
			walk(child, trimBelow, trimBelow)
		}
	}
}
