package faults

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// secretValues are the secret values the rows saw: every credential's password, whatever became
// of it, so that the leak scan looks for superseded ones too.
var secretValues = struct {
	sync.Mutex
	m map[string]string // value: where it was seen
}{m: map[string]string{}}

// sawSecret remembers a secret value (values shorter than 8 bytes would match by chance).
func sawSecret(value, where string) {
	if len(value) < 8 {
		return
	}
	secretValues.Lock()
	defer secretValues.Unlock()
	secretValues.m[value] = where
}

// rememberSecrets adds to the leak scan the data of every Secret in ns ("" for every namespace of
// the package's: on a shared ground the other packages' Secrets hold values that are no secret of
// this package's operators, such as External Secrets Operator's mount_type "database"), usernames
// aside, and says how many Secrets there are.
func rememberSecrets(ns string) (int, error) {
	list := &corev1.SecretList{}
	if err := fw.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		return 0, err
	}
	n := 0
	for _, s := range list.Items {
		if !strings.HasPrefix(s.Namespace, fw.Name("")) {
			continue
		}
		n++
		for k, v := range s.Data {
			if strings.HasSuffix(strings.ToLower(k), "username") {
				continue // usernames are no secret: keyroll logs them
			}
			sawSecret(string(v), fmt.Sprintf("Secret %s/%s key %s", s.Namespace, s.Name, k))
		}
	}
	return n, nil
}

// scanLogs looks for every secret value in the operators' logs: those the rows saw (among them the
// data of the Secrets of each row's namespace once its clusters settled: a row's clusters, and the
// Secrets they own, are deleted when it ends) and the data of every Secret of the package's
// namespaces now (keyroll's token Secrets in its operator namespace, what the last rows left). It returns a
// summary, and the places of the values found, never the values.
func scanLogs() (summary string, leaks []string) {
	left, _ := rememberSecrets("")
	sawSecret(fw.Ground.Vault.RootToken, "Vault's root token")
	text := logs.text()
	secretValues.Lock()
	defer secretValues.Unlock()
	for v, where := range secretValues.m {
		if strings.Contains(text, v) {
			leaks = append(leaks, where)
		}
	}
	sort.Strings(leaks)
	lines := strings.Count(text, "\n") + 1
	return fmt.Sprintf("Leak scan: %d secret values (every credential the rows saw, the data of every row's Secrets and of the %d Secrets left in the package's namespaces, Vault's root token) searched for in the %d log lines of the operator processes: %d found.",
		len(secretValues.m), left, lines, len(leaks)), leaks
}

// orphansLeft lists, across every role of the matrix, the leases Vault holds that no RedisCluster's
// ledger holds, and says how many leases are live in all.
func orphansLeft() (live int, orphans []string, err error) {
	list := &v1beta1.RedisClusterList{}
	if err := fw.Client.List(context.Background(), list); err != nil {
		return 0, nil, err
	}
	known := map[string]bool{}
	for _, rc := range list.Items {
		for _, l := range rc.Status.Leases {
			known[l.LeaseID] = true
		}
	}
	for _, role := range roles {
		ids, err := fw.ListLeases(fw.Path(role.Name))
		if err != nil {
			return 0, nil, err
		}
		for _, id := range ids {
			live++
			if !known[id] {
				orphans = append(orphans, id)
			}
		}
	}
	return live, orphans, nil
}
