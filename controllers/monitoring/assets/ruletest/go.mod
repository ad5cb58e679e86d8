module github.com/loom-dev/loom/controllers/monitoring/assets/ruletest

go 1.26.0

require (
	github.com/loom-dev/loom v0.0.0-00010101000000-000000000000
	github.com/prometheus/prometheus v0.316.0
)

// The rules and dashboards under test are this repository's.
replace github.com/loom-dev/loom => ../../../..
