package kubeproxy

import (
	"bytes"
	"testing"
)

func TestMetricValue(t *testing.T) {
	body := []byte(`# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time proxy rules were successfully synced
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds_other 7
kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7646e+09
`)
	got, err := metricValue(body, syncedMetric)
	if err != nil || got != 1.7646e+09 {
		t.Errorf("metricValue = %v, %v; want 1.7646e+09", got, err)
	}
	// kube-proxy v1.37 labels it by IP family: every family must have
	// synced.
	labelled := []byte(`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7961340188354783e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 0
`)
	if got, err := metricValue(labelled, syncedMetric); err != nil || got != 0 {
		t.Errorf("metricValue(two families, one not synced) = %v, %v; want 0", got, err)
	}
	if got, err := metricValue(labelled[:bytes.IndexByte(labelled, '\n')+1], syncedMetric); err != nil || got != 1.7961340188354783e+09 {
		t.Errorf("metricValue(IPv4 only) = %v, %v", got, err)
	}
	if _, err := metricValue([]byte("process_start_time_seconds 1\n"), syncedMetric); err == nil {
		t.Error("a body without the sample gave no error")
	}
}
