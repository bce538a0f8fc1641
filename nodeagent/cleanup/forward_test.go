package cleanup

import "testing"

// forwardSave is a filter table as the iptables backend leaves it on a
// host whose FORWARD policy is DROP: the jump into PROXYSHIFT-FORWARD and
// its accept rules, next to Docker's.
const forwardSave = `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER-USER - [0:0]
:PROXYSHIFT-FILTER - [0:0]
:PROXYSHIFT-FORWARD - [0:0]
-A FORWARD -m comment --comment "proxyshift forwarding" -j PROXYSHIFT-FORWARD
-A FORWARD -j DOCKER-USER
-A PROXYSHIFT-FORWARD -m conntrack --ctstate NEW -j PROXYSHIFT-FILTER
-A PROXYSHIFT-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
-A DOCKER-USER -j RETURN
COMMIT
`

// TestPlanProxyshiftForward checks that the agent's cleanup removes the
// forwarding chain and its jump, and nothing of the host's: the FORWARD
// policy is never in a plan (a restore that declared FORWARD would reset
// it), nor Docker's chain.
func TestPlanProxyshiftForward(t *testing.T) {
	got := string(planIPTables([]byte(forwardSave), Proxyshift).script())
	want := `*filter
-D FORWARD -m comment --comment "proxyshift forwarding" -j PROXYSHIFT-FORWARD
-F PROXYSHIFT-FILTER
-F PROXYSHIFT-FORWARD
-X PROXYSHIFT-FILTER
-X PROXYSHIFT-FORWARD
COMMIT
`
	if got != want {
		t.Errorf("script:\n%s\nwant:\n%s", got, want)
	}
}
