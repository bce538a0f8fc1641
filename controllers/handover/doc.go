// Package handover decides how the operator stops and restarts the
// cluster's kube-proxy node by node, so that a node is never served by
// two proxies' leftovers nor by none. It is pure: Plan takes what the API
// says (the kube-proxy DaemonSet, its pods, the Nodes' labels and the
// ProxyNodes) and returns what to write; the reconciler in controllers/
// reads and writes.
//
// # Why a label and an affinity
//
// kube-proxy is a DaemonSet the cluster (kubeadm, a distribution) owns.
// proxyshift changes it as little as it can and in a way it can undo
// exactly: the DaemonSet gets one required node affinity requirement,
// network.proxyshift.io/service-proxy NotIn [proxyshift] (LabelKey,
// LabelValue), and a node kube-proxy must leave gets that label. The
// DaemonSet controller then removes kube-proxy's pod from that node, and
// puts one back when the label goes. Required nodeSelectorTerms are ORed,
// so the requirement is added to every term; a DaemonSet with no required
// terms gets one term holding only it. AnnotationAffinity on the
// DaemonSet records that proxyshift added it, and which of the affinity's
// levels (affinity, nodeAffinity, the required selector) it created.
// Undoing removes exactly that: the requirement from every term, a term
// it leaves empty (one that held only the requirement), and the levels
// proxyshift created when nothing else is in them; nothing a person or
// another tool put there. Only a DaemonSet carrying the record is undone.
//
// # Why the rollout strategy changes too
//
// Any change to the pod template makes the DaemonSet controller replace
// every kube-proxy pod. With the default RollingUpdate (maxUnavailable 1,
// maxSurge 0) each node would be without kube-proxy for a moment, and a
// node's Services would stop being updated. So, in the same update that
// adds the affinity, a RollingUpdate strategy becomes maxSurge 1,
// maxUnavailable 0: the new pod starts next to the old one before the
// old one goes (for that moment two kube-proxy pods sync the same rules
// into the same kernel; kube-proxy takes the xtables lock and writes
// whole tables, so they agree). AnnotationStrategy records the strategy
// as it was. It is put back only after the affinity has been removed and
// the roll that removal starts has finished (the status shows every
// scheduled pod updated for the current generation), so that roll surges
// too. An OnDelete strategy is left alone: the DaemonSet controller still
// removes pods from nodes its affinity excludes, and rolls nothing else.
//
// # Per node
//
// A ProxyNode says whether kube-proxy must be off on its node (Want):
//
//   - Off when spec.desiredMode is a proxyshift mode and the agent is at
//     phase WaitingForKubeProxy or already serves a proxyshift mode;
//   - On when spec.desiredMode is kube-proxy, or when it is empty and
//     kube-proxy serves the node (status.activeMode kube-proxy);
//   - Off when spec.desiredMode is empty and proxyshift serves the node
//     (its ProxyConfig was deleted: nodes keep what serves them);
//   - Keep otherwise (no status yet; a switch to a proxyshift mode that
//     has not reached WaitingForKubeProxy): the label is neither added
//     nor removed, so an agent restarting mid-switch does not make
//     kube-proxy come and go.
//
// A node is labelled only when the DaemonSet already carries the
// affinity, never when kube-proxy should serve it. The label is
// proxyshift's own (its prefix is proxyshift's), so it is removed from
// every node that wants kube-proxy On. spec.kubeProxyStopped is true when
// the node carries the label and no pod of the DaemonSet (its selector,
// in its namespace, terminating ones included) is bound to the node, and
// false again as soon as that stops being true. The affinity stays while
// any node carries the label or wants kube-proxy Off; then it is removed,
// and the strategy follows once that roll is done: uninstalling leaves
// the cluster as it was.
//
// # No kube-proxy, and conflicts
//
// With no DaemonSet configured (--kube-proxy-daemonset="") the cluster has
// no kube-proxy: every ProxyNode gets kubeProxyStopped true, and nothing
// else is done. With one configured that does not exist, nothing is
// written (there is nothing to stop it with) and every node that reports
// kube-proxy's objects (status.kubeProxyMode) is a conflict the reconciler
// reports; the planner refuses to move such nodes, and refuses mode
// kube-proxy, for the same reason.
package handover
