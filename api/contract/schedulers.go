package contract

import (
	"fmt"
	"slices"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Schedulers are the IPVS schedulers the API accepts (the enum of
// v1alpha1.IPVSScheduler), each implemented by its own kernel module
// (SchedulerModule).
var Schedulers = []v1alpha1.IPVSScheduler{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh"}

// DefaultScheduler is the scheduler used when none is set (the API's
// default for spec.ipvs.scheduler).
const DefaultScheduler v1alpha1.IPVSScheduler = "rr"

// SchedulerModule is the kernel module that implements scheduler s.
func SchedulerModule(s v1alpha1.IPVSScheduler) string { return "ip_vs_" + string(s) }

// Scheduler returns s, or DefaultScheduler when s is empty, and fails on a
// scheduler that is not one of Schedulers.
func Scheduler(s v1alpha1.IPVSScheduler) (v1alpha1.IPVSScheduler, error) {
	if s == "" {
		return DefaultScheduler, nil
	}
	if !slices.Contains(Schedulers, s) {
		return "", fmt.Errorf("unknown IPVS scheduler %q (want one of %v)", s, Schedulers)
	}
	return s, nil
}
