package kubeproxy

import "testing"

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
	if _, err := metricValue([]byte("process_start_time_seconds 1\n"), syncedMetric); err == nil {
		t.Error("a body without the sample gave no error")
	}
}
