//go:build tools

// Package tools pins the Prometheus Operator that e2e tests run against the
// simulated cluster. build.sh builds it into a cache directory keyed by
// version, with the operator's own CRDs next to it.
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
)
