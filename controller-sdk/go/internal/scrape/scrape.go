// Package scrape reads the SDK's metrics as controller-runtime's registry serves them, for the
// tests.
package scrape

import (
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Sample sums the counters, gauges and histogram counts of metric whose labels include
// labels, in controller-runtime's registry.
func Sample(t *testing.T, metric string, labels map[string]string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, family := range families {
		if family.GetName() != metric {
			continue
		}
	series:
		for _, m := range family.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}
