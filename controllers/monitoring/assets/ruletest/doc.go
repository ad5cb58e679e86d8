// Package ruletest evaluates Loom's GPU rules and dashboard queries with
// Prometheus's own PromQL engine and rule manager. It is a module of its
// own, a test-only one: github.com/prometheus/prometheus requires a newer
// github.com/prometheus/client_golang than Loom builds with, and a module
// here keeps it out of Loom's go.mod. Run it with
//
//	cd controllers/monitoring/assets/ruletest && go test ./...
package ruletest
