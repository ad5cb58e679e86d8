// Command crdtrim drops the descriptions from the embedded pod templates of
// a generated CRD. A PodTemplateSpec's documented schema is about 600 KB, two
// of them would push the TrainingJob CRD near etcd's 1.5 MB object limit, and
// `kubectl explain pod.spec` documents those fields already. Loom's own
// fields keep their descriptions.
//
// It also bounds what the CRD's CEL rules iterate in those pod templates
// (the rules that GPU quantities are whole numbers): at most 64 containers
// and 64 init containers, 64 resources per requests or limits map, and 64
// characters per quantity. Without these bounds the API server's static cost
// estimate of such a rule, computed from the 3 MB request limit, exceeds the
// CRD's CEL budget many times over; no real pod comes near them.
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
	bound(crd)
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

// The bounds bound sets on every pod spec schema (see the package comment).
const (
	maxContainers    = 64
	maxResources     = 64
	maxQuantityChars = 64
)

// bound sets maxItems on the containers and init containers of every pod
// spec schema below v, and maxProperties and maxLength on their (and the
// pod's own) resource requests and limits.
func bound(v any) {
	switch t := v.(type) {
	case map[string]any:
		if props, ok := t["properties"].(map[string]any); ok && props["containers"] != nil && props["initContainers"] != nil {
			for _, name := range []string{"containers", "initContainers"} {
				list, ok := props[name].(map[string]any)
				if !ok {
					continue
				}
				list["maxItems"] = maxContainers
				if item, ok := list["items"].(map[string]any); ok {
					boundResources(item)
				}
			}
			boundResources(t)
		}
		for _, child := range t {
			bound(child)
		}
	case []any:
		for _, child := range t {
			bound(child)
		}
	}
}

// boundResources bounds the requests and limits of the resources property
// of schema s (a container's or a pod spec's), when it has one.
func boundResources(s map[string]any) {
	props, _ := s["properties"].(map[string]any)
	res, _ := props["resources"].(map[string]any)
	resProps, _ := res["properties"].(map[string]any)
	for _, name := range []string{"requests", "limits"} {
		m, ok := resProps[name].(map[string]any)
		if !ok {
			continue
		}
		m["maxProperties"] = maxResources
		if q, ok := m["additionalProperties"].(map[string]any); ok {
			q["maxLength"] = maxQuantityChars
		}
	}
}
