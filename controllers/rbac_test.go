package controllers

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// reviewed is every permission the manager holds (deploy/rbac/role.yaml, which the chart copies),
// each with the code that uses it: a permission added without a reason here fails, and so does a
// reason whose permission is gone. The key is "<Kind> <group>/<resource> <verb>", with
// "[<names>]" when the rule is limited to resourceNames.
var reviewed = map[string]string{
	"ClusterRole keyroll.dev/redisclusters get":                    "the cache (informers)",
	"ClusterRole keyroll.dev/redisclusters list":                   "the cache (informers)",
	"ClusterRole keyroll.dev/redisclusters watch":                  "the cache (informers)",
	"ClusterRole keyroll.dev/redisclusters patch":                  "the finalizer keyroll.dev/revoke-leases (rediscluster/reconcile.go, delete.go)",
	"ClusterRole keyroll.dev/vaultconnections get":                 "the cache (informers)",
	"ClusterRole keyroll.dev/vaultconnections list":                "the cache (informers)",
	"ClusterRole keyroll.dev/vaultconnections watch":               "the cache (informers)",
	"ClusterRole keyroll.dev/vaultconnections patch":               "the finalizer keyroll.dev/in-use (vaultconnection/reconciler.go)",
	"ClusterRole keyroll.dev/redisclusters/status patch":           "the status and its lease ledger (apply.PatchStatus)",
	"ClusterRole keyroll.dev/vaultconnections/status patch":        "the status: login, tokens, sweep (apply.PatchStatus)",
	"ClusterRole keyroll.dev/redisclusters/finalizers update":      "owner references that block the RedisCluster's deletion, on the objects it owns",
	"ClusterRole /secrets get":                                     "the cache of keyroll's labelled Secrets; the API reader for a VaultConnection's Secrets and the token store",
	"ClusterRole /secrets list":                                    "the cache of keyroll's labelled Secrets",
	"ClusterRole /secrets watch":                                   "the cache of keyroll's labelled Secrets",
	"ClusterRole /secrets create":                                  "server-side apply of the owned Secrets; the token store's Secret",
	"ClusterRole /secrets patch":                                   "server-side apply of the owned Secrets; the token store's merge patches",
	"ClusterRole /services get":                                    "the cache",
	"ClusterRole /services list":                                   "the cache",
	"ClusterRole /services watch":                                  "the cache",
	"ClusterRole /services create":                                 "server-side apply of the client and headless Services",
	"ClusterRole /services patch":                                  "server-side apply of the client and headless Services",
	"ClusterRole /configmaps get":                                  "the cache",
	"ClusterRole /configmaps list":                                 "the cache",
	"ClusterRole /configmaps watch":                                "the cache",
	"ClusterRole /configmaps create":                               "server-side apply of the start script's ConfigMap",
	"ClusterRole /configmaps patch":                                "server-side apply of the start script's ConfigMap",
	"ClusterRole /pods get":                                        "the cache: readiness of Redis pods and consumers",
	"ClusterRole /pods list":                                       "the cache",
	"ClusterRole /pods watch":                                      "the cache",
	"ClusterRole /pods patch":                                      "the primary's role label (rediscluster/primary.go)",
	"ClusterRole /pods delete":                                     "a rollout's restart of a Redis pod or an OnDelete consumer's pod, one at a time (rediscluster/rollout_engine.go)",
	"ClusterRole apps/statefulsets get":                            "the cache",
	"ClusterRole apps/statefulsets list":                           "the cache",
	"ClusterRole apps/statefulsets watch":                          "the cache",
	"ClusterRole apps/statefulsets create":                         "server-side apply of the Redis StatefulSet",
	"ClusterRole apps/statefulsets patch":                          "server-side apply of the Redis StatefulSet; a consumer StatefulSet's pod-template annotation",
	"ClusterRole apps/controllerrevisions get":                     "the cache of the Redis StatefulSets' revisions: which pods the StatefulSet made (rediscluster/nodes_members.go)",
	"ClusterRole apps/controllerrevisions list":                    "the cache of the Redis StatefulSets' revisions",
	"ClusterRole apps/controllerrevisions watch":                   "the cache of the Redis StatefulSets' revisions",
	"ClusterRole apps/replicasets get":                             "a client pod's ReplicaSet, checked before its Deployment is taken for the pod's workload (rediscluster/podowner.go)",
	"ClusterRole apps/deployments get":                             "the cache: consumers",
	"ClusterRole apps/deployments list":                            "the cache: consumers",
	"ClusterRole apps/deployments watch":                           "the cache: consumers",
	"ClusterRole apps/deployments patch":                           "a consumer's pod-template annotation (rediscluster/rollout_consumers.go)",
	"ClusterRole apps/daemonsets get":                              "the cache: consumers",
	"ClusterRole apps/daemonsets list":                             "the cache: consumers",
	"ClusterRole apps/daemonsets watch":                            "the cache: consumers",
	"ClusterRole apps/daemonsets patch":                            "a consumer's pod-template annotation (rediscluster/rollout_consumers.go)",
	"ClusterRole batch/cronjobs list":                              "rollout.discoverConsumers reports CronJobs that reference the credentials Secret (rediscluster/rollout_discover.go)",
	"ClusterRole batch/jobs list":                                  "rollout.discoverConsumers reports Jobs that reference the credentials Secret (rediscluster/rollout_discover.go)",
	"ClusterRole policy/poddisruptionbudgets get":                  "the cache",
	"ClusterRole policy/poddisruptionbudgets list":                 "the cache",
	"ClusterRole policy/poddisruptionbudgets watch":                "the cache",
	"ClusterRole policy/poddisruptionbudgets create":               "server-side apply of the Redis pods' PodDisruptionBudget",
	"ClusterRole policy/poddisruptionbudgets patch":                "server-side apply of the Redis pods' PodDisruptionBudget",
	"ClusterRole networking.k8s.io/networkpolicies get":            "the cache",
	"ClusterRole networking.k8s.io/networkpolicies list":           "the cache",
	"ClusterRole networking.k8s.io/networkpolicies watch":          "the cache",
	"ClusterRole networking.k8s.io/networkpolicies create":         "server-side apply of spec.networkPolicy's NetworkPolicy",
	"ClusterRole networking.k8s.io/networkpolicies patch":          "server-side apply of spec.networkPolicy's NetworkPolicy",
	"ClusterRole networking.k8s.io/networkpolicies delete":         "the NetworkPolicy, once spec.networkPolicy is turned off (rediscluster/netpol.go)",
	"ClusterRole external-secrets.io/externalsecrets get":          "the cache",
	"ClusterRole external-secrets.io/externalsecrets list":         "the cache",
	"ClusterRole external-secrets.io/externalsecrets watch":        "the cache",
	"ClusterRole external-secrets.io/externalsecrets create":       "server-side apply of the ExternalSecret (ExternalSecret mode)",
	"ClusterRole external-secrets.io/externalsecrets patch":        "server-side apply of the ExternalSecret; a refresh request's annotation",
	"ClusterRole external-secrets.io/externalsecrets delete":       "the ExternalSecret, before the leases are revoked on delete (externalsecret.Retire)",
	"ClusterRole events.k8s.io/events create":                      "events",
	"ClusterRole events.k8s.io/events patch":                       "events (a series)",
	"ClusterRole authentication.k8s.io/tokenreviews create":        "a token minted for Vault is reviewed, and refused if the API server accepts it; the metrics endpoint's authentication",
	"ClusterRole authorization.k8s.io/subjectaccessreviews create": "the metrics endpoint's authorization",
	"ClusterRole apiextensions.k8s.io/customresourcedefinitions get [redisclusters.keyroll.dev,vaultconnections.keyroll.dev]":           "the conversion webhook: the CRDs' conversion settings and storedVersions (conversion/keeper.go)",
	"ClusterRole apiextensions.k8s.io/customresourcedefinitions update [redisclusters.keyroll.dev,vaultconnections.keyroll.dev]":        "the conversion webhook: its address and CA bundle in the CRDs (conversion/keeper.go inject)",
	"ClusterRole apiextensions.k8s.io/customresourcedefinitions/status update [redisclusters.keyroll.dev,vaultconnections.keyroll.dev]": "storedVersions set to the storage version once every object is rewritten (conversion/keeper.go migrate)",
	"Role /events create":                                  "leader election's events",
	"Role /events patch":                                   "leader election's events",
	"Role coordination.k8s.io/leases get":                  "leader election",
	"Role coordination.k8s.io/leases create":               "leader election",
	"Role coordination.k8s.io/leases update":               "leader election",
	"Role /serviceaccounts/token create [keyroll-manager]": "Vault's Kubernetes auth: a token of the operator's own service account, and of no other",
}

// TestManagerRBACIsLeastPrivilege: the manager's permissions are exactly the reviewed ones: no
// wildcard, no token of any service account but its own (and none cluster-wide), nothing the code
// does not use.
func TestManagerRBACIsLeastPrivilege(t *testing.T) {
	b, err := os.ReadFile("../deploy/rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	granted := map[string]bool{}
	for doc := range bytes.SplitSeq(b, []byte("\n---")) {
		var role struct {
			Kind  string              `json:"kind"`
			Rules []rbacv1.PolicyRule `json:"rules"`
		}
		if err := yaml.Unmarshal(doc, &role); err != nil {
			t.Fatal(err)
		}
		for _, r := range role.Rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					if g == "*" || res == "*" || slices.Contains(r.Verbs, "*") {
						t.Errorf("%s grants a wildcard: %+v", role.Kind, r)
					}
					if res == "serviceaccounts/token" && (role.Kind != "Role" || len(r.ResourceNames) == 0) {
						t.Errorf("%s grants tokens of any service account: %+v", role.Kind, r)
					}
					for _, v := range r.Verbs {
						key := fmt.Sprintf("%s %s/%s %s", role.Kind, g, res, v)
						if len(r.ResourceNames) > 0 {
							key += " [" + strings.Join(r.ResourceNames, ",") + "]"
						}
						granted[key] = true
					}
				}
			}
		}
	}
	for key := range granted {
		if _, ok := reviewed[key]; !ok {
			t.Errorf("%s is granted but not reviewed: what uses it?", key)
		}
	}
	for key := range reviewed {
		if !granted[key] {
			t.Errorf("%s is reviewed but no longer granted: drop it from the list", key)
		}
	}
}

// TestNamespaceIdentityRoleIsBoundByNamespacesOnly: the ClusterRole for identity Namespace grants
// tokens of the one service account keyroll logs in with for a namespace, and the install binds it
// nowhere: a namespace that opts in binds it with a RoleBinding of its own.
func TestNamespaceIdentityRoleIsBoundByNamespacesOnly(t *testing.T) {
	b, err := os.ReadFile("../deploy/rbac/namespace_identity_role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatal(err)
	}
	want := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{"keyroll-vault"}, Verbs: []string{"create"}}
	if len(role.Rules) != 1 || fmt.Sprint(role.Rules[0]) != fmt.Sprint(want) {
		t.Errorf("%s rules %+v, want only %+v", role.Name, role.Rules, want)
	}
	bindings, err := os.ReadFile("../deploy/rbac/role_binding.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(bindings, []byte(role.Name)) {
		t.Errorf("the install binds %s: it is for each namespace to bind", role.Name)
	}
}
