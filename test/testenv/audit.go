package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// AuditLogName is the file, in the directory given to LaunchAudited, that
// the API server writes its audit events to (one JSON object a line).
const AuditLogName = "audit.log"

// LaunchAudited is Launch with the API server's audit log on: it records,
// at level Metadata and once per request (stage ResponseComplete), every
// create, update, patch, delete and deletecollection made by the named
// users, and nothing else. A benchmark counts a program's API writes from
// it, as the API server saw them, with no help from the program. The log
// is dir/AuditLogName; users get their credentials from
// Env.WriteUserKubeconfig.
func LaunchAudited(assets, dir string, users ...string) (*Env, error) {
	if len(users) == 0 {
		return nil, fmt.Errorf("LaunchAudited: no user to audit")
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	quoted := make([]string, len(users))
	for i, u := range users {
		quoted[i] = fmt.Sprintf("%q", u)
	}
	body := fmt.Sprintf(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted", "Panic"]
rules:
- level: Metadata
  users: [%s]
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
`, strings.Join(quoted, ", "))
	if err := os.WriteFile(policy, []byte(body), 0o600); err != nil {
		return nil, err
	}
	return launch(assets, dir, ServiceCIDR, func(env *envtest.Environment) {
		args := env.ControlPlane.GetAPIServer().Configure()
		args.Set("audit-policy-file", policy)
		args.Set("audit-log-path", filepath.Join(dir, AuditLogName))
		args.Set("audit-log-format", "json")
		args.Set("audit-log-maxsize", "0") // no rotation: the reader wants one file
	})
}

// WriteUserKubeconfig gives the API server a user of this name in these
// groups (system:masters is every permission) and writes a kubeconfig
// file for it at path, so a program under test runs as a user of its own.
func (e *Env) WriteUserKubeconfig(name string, groups []string, path string) error {
	user, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, e.Config)
	if err != nil {
		return fmt.Errorf("create user %s: %w", name, err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(path, kubeconfig, 0o600)
}
