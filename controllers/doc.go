// Package controllers holds the operator's reconcilers. They stay thin: each
// reads the cluster, hands what it read to a pure planning function, and
// writes the plan's result, so every decision is unit-testable without an
// API server.
//
// # Layout
//
//   - controllers: ProxyConfigReconciler (read, plan, write) and its watches
//     (SetupWithManager, CacheOptions).
//   - controllers/plan: the planner, plan.Plan(config, other configs, nodes,
//     ProxyNodes, now) -> ProxyNodes to create/update, the status, events,
//     and when to look again. Pure; table- and simulation-tested.
//   - controllers/preflight: checks a node's kernel facts against what a
//     mode needs (preflight.Problems). What a mode needs, and the rest of
//     what the operator and the agent agree on, is api/contract.
//   - HandoverReconciler and controllers/handover: stop kube-proxy on the
//     nodes proxyshift takes over and let it back on the nodes handed back
//     (a node label, an affinity on kube-proxy's DaemonSet, and each
//     ProxyNode's spec.kubeProxyStopped); handover.Plan decides, the
//     package doc says why it is done that way.
//
// # A rollout's memory lives in the API
//
// The operator keeps no rollout state in memory; it can be killed at any
// point and a new leader continues from what the API says:
//
//   - ProxyNode.spec: desiredMode, settings and configRef{name, generation}
//     of the write that produced it.
//   - ProxyNode annotations, written in the same update as the spec:
//     network.proxyshift.io/rollout (the rollout that moved the node,
//     "<config>@<status.startTime>"), .../requested-at (when; the node
//     timeout counts from it), .../previous-mode, .../previous-settings and
//     .../previous-config (what served traffic before, and the configRef of
//     the spec that asked for it; a rollback writes these back), and
//     .../rolled-back (the rollout that sent it back).
//   - ProxyConfig.status: startTime names the current rollout; the
//     Progressing condition's reason is the stage (Preflight, Canary,
//     CanaryPause, RollingOut, RollingBack, ...); canaryPassedTime is when
//     the rollout's canary passed, from which the canary pause counts; a
//     Degraded reason of NodeFailed, RolledBack or RollbackFailed marks a
//     failed rollout, which holds until the spec changes; failedNodes keeps
//     the failure reasons.
//
// The status is written before the ProxyNode updates of the same pass, so
// no node ever carries the name of a rollout the API does not know.
//
// # Definitions
//
// A node is in transition when its ProxyNode asks for a mode (spec.
// desiredMode set) that its status does not reflect: status.activeMode
// equals it, phase is Active, status.observedConfig equals spec.configRef,
// and the node is healthy (condition Ready not False, condition Degraded
// not True). Failed nodes are in transition too; at most maxUnavailable of
// a config's nodes are ever in transition, and the operator only ever
// adds a node to that set when there is room (redirecting a node already in
// transition is free). A config's nodes are those it selects alone and,
// until they settle, the nodes in transition it moved (its name in the
// rollout annotation, else in spec.configRef) that it no longer selects
// alone: the selector or their labels changed, or another ProxyConfig
// selects them too. It finishes what it started: they count against its
// maxUnavailable, their failures stop its rollout and are listed in its
// failedNodes, a rollback returns them, and the Progressing condition
// names them; it never starts them anew. A node is updated when it asks for the target mode
// and settings and is not in transition. It has failed when, for the spec
// it was given, the agent reports phase Failed, an unhealthy condition, or
// Active in another mode (no silent fallback), or when it is still in
// transition nodeTimeout after requested-at.
//
// "For the current config generation" is read as: the node's spec carries
// the config's current mode and settings, and the status echoes that
// spec's configRef. Changing only the rollout policy (paused,
// maxUnavailable, canary, timeout) bumps the generation but moves no node.
//
// # Rollout
//
// For each ProxyConfig, the selected nodes (empty selector: all) get a
// ProxyNode (owned by the Node, empty spec: the agent only reports). A node
// another ProxyConfig selects too is a conflict: reported on both (Degraded
// reason Conflict, a Conflict event), never created, written or counted as
// updated by either, except that the config that moved a node finishes
// what it started (below).
//
// Preflight: before a rollout's first move, every node that must move must
// have reported kernel facts that satisfy preflight.Problems for the target.
// Missing facts wait (phase Preflight) until nodeTimeout after the ProxyNode
// was created; then, like an incapable node, they block the rollout (phase
// Failed, reason PreflightFailed, the nodes and reasons in failedNodes) and
// no node changes. After the start, a node that joins is checked alone and,
// if it cannot run the mode, is left out and reported.
//
// Then the canary (spec.rollout.canary.nodes, within maxUnavailable), the
// canary pause (phase Paused, reason CanaryPause; it counts from the
// canary's success, status.canaryPassedTime, so time spent paused by a
// person after that counts toward it and time before it does not), then the rest, as fast as maxUnavailable (a
// number, or a percentage of the selected nodes rounded down, at least 1)
// allows. A node that joins after completion starts a new (small) rollout.
// A new mode or new settings mid-rollout start a new rollout from what the
// nodes report: nodes already in transition are redirected first, costing
// no room. spec.rollout.paused stops new starts (phase Paused) and the same
// rollout resumes when it is cleared.
//
// Failure: a node the current rollout moved fails: no new node starts.
// With autoRollback (the default) every node this rollout moved returns to
// its previous mode and settings, within maxUnavailable (phase RollingBack,
// which neither paused nor another policy change stops; a new mode or new
// settings do start a new rollout from what the nodes report),
// then the rollout ends Failed with reason RolledBack (or RollbackFailed).
// Without it, it holds at Failed (reason NodeFailed). Any spec change after
// that retries: a new rollout, in which failed nodes are written again with
// the new generation. A node that became unhealthy after the rollout
// completed is reported (Degraded reason NodeUnhealthy) but rolls nothing
// back. A node with no previous mode (its agent never reported one) cannot
// be rolled back and is reported so.
//
// # Changing kube-proxy's own mode
//
// A ProxyConfig with mode kube-proxy and spec.kubeProxy runs as legs of
// one rollout (controllers/plan/bridge.go): every selected node is taken
// over into the bridge mode; once no kube-proxy pod runs on them the
// operator writes the new mode into kube-proxy's ConfigMap
// (controllers/kubeproxyconfig); then the nodes are handed back to
// kube-proxy, whose pods start in the new mode. A leg that fails is
// rolled back, and the whole change then runs again towards kube-proxy's
// previous mode, restoring the ConfigMap. The stage is kept in
// status.kubeProxyBridge; each leg writes its specs with its own
// configRef.step.
//
// # Agent contract
//
// An empty spec.desiredMode means "report, change nothing". The agent acts
// on each new spec.configRef (a rollback carries a different configRef from
// the move it undoes: the previous spec's, or generation 0 for "what ran
// before proxyshift"), and reports status.observedConfig = that configRef
// with activeMode and phase when done. Health is read from conditions
// Ready and Degraded (contract.ConditionReady, contract.ConditionDegraded;
// the rule is contract.Healthy).
//
// # Writes
//
// Only what changed is written: the status when it differs (a change of
// the node counts alone at most once per StatusCoalesce, default 1s), and
// ProxyNodes with optimistic concurrency (resourceVersion from the cache),
// so a stale cache or a deposed leader's write fails instead of exceeding
// the limit. After writing, the reconciler waits for the cache to show its
// own writes before planning again; on its first pass after start it also
// waits for the cache to catch up with a live list (a previous leader's last
// writes). Nodes are watched as metadata only; ProxyNode updates that only
// refresh sync figures are ignored; there is no periodic resync (a
// RequeueAfter covers node timeouts and the canary pause). A rollout costs
// two writes per node (create, move) plus a few status writes and events.
//
// Events: RolloutStarted, CanaryPassed, NodeUpdated (one per pass, naming
// the nodes newly updated), NodeFailed, RollbackStarted, RolloutCompleted,
// Conflict, PreflightFailed, AcknowledgementRequired. They derive from status changes, so a restart
// repeats none, except that the first pass of a new process does not
// announce nodes that were already updated.
package controllers

// The operator's permissions, rendered into config/rbac/operator by
// `make manifests`; config/rbac/README.md says what uses each verb. It
// lists and watches ProxyConfigs, ProxyNodes, Nodes and Services (the
// behaviour-diff preflight reads them; the manager's
// cache serves every get), writes ProxyConfig status and ProxyNodes,
// records Events (events.k8s.io), and checks the tokens that scrape its
// metrics (TokenReviews, SubjectAccessReviews). For the handover it
// watches kube-proxy's DaemonSet and updates it (its node affinity and
// update strategy), watches the pods of its namespace (which nodes still
// run kube-proxy), and patches Nodes (the handover label). To change
// kube-proxy's own mode (spec.kubeProxy) it reads and updates kube-proxy's
// ConfigMap: only ConfigMaps named kube-proxy (resourceNames; list and
// watch are asked for that one, in its namespace, with a metadata.name
// field selector, which resourceNames allows). A ClusterRole, because
// kustomize's namespace setting would move a Role out of kube-system; a
// --kube-proxy-configmap of another name needs that name added. Leader
// election's Lease and its Events are a Role in its own namespace
// (config/rbac).
//
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxyconfigs,verbs=list;watch
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxyconfigs/status,verbs=update
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxynodes,verbs=list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=list;watch;update
// +kubebuilder:rbac:groups="",resources=configmaps,resourceNames=kube-proxy,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
