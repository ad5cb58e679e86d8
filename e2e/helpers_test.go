package e2e

import "k8s.io/apimachinery/pkg/runtime/schema"

func schemaGVK(group, version, kind string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: group, Version: version, Kind: kind}
}
