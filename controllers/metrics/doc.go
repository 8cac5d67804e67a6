// Package metrics holds keyroll's Prometheus metrics (docs/metrics.md describes each one).
package metrics
