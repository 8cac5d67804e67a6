package vaultconnection

import (
	"context"
	"fmt"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/status"
	"github.com/keyroll/keyroll/vault"
)

// observeNamespaces is observe with identity Namespace: the connection's own client reads
// Vault's health and never logs in; each namespace that holds leases through the connection keeps
// the tokens alive that own them, with its own login. A namespace whose tokens cannot be kept (its
// service account or Vault role missing, say) is reported (Degraded, NamespaceLoginFailed) and
// does not hold up the others. It returns every namespace's tokens.
func (r *Reconciler) observeNamespaces(ctx context.Context, vc *v1beta1.VaultConnection, vcl connection.Client, needs tokenNeeds) ([]vault.TokenStatus, error) {
	if err := health(ctx, vc, vcl); err != nil {
		return nil, err
	}
	var held []vault.TokenStatus
	var statuses []v1beta1.TokenStatus
	var failed []string
	for _, ns := range slices.Sorted(maps.Keys(needs.byNamespace)) {
		nsc, err := r.Connector.NamespaceClient(ctx, vc, ns)
		if err == nil {
			var kept []vault.TokenStatus
			kept, err = nsc.KeepTokens(ctx, needs.byNamespace[ns])
			held = append(held, kept...)
			for _, t := range tokenStatuses(kept, needs) {
				t.Namespace = ns
				statuses = append(statuses, t)
			}
		}
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", ns, err))
			log.FromContext(ctx).Info("Keeping a namespace's Vault tokens failed; tried again at the next check", "identityNamespace", ns, "error", err.Error())
		}
	}
	vc.Status.Tokens = statuses[:min(len(statuses), 64)]
	vc.Status.TokenExpiresAt = nil
	r.Metrics.SetTokens(vc.Name, len(held))
	conds := status.Setter{Obj: vc, Conditions: &vc.Status.Conditions, Recorder: r.Recorder}
	if len(failed) > 0 {
		msg := fmt.Sprintf("identity Namespace: the tokens of %d namespace(s) could not be kept: %s", len(failed), listSome(failed, 5))
		if conds.Set(v1beta1.ConditionDegraded, metav1.ConditionTrue, v1beta1.ReasonNamespaceLoginFailed, msg) {
			conds.Event(true, v1beta1.ReasonNamespaceLoginFailed, "KeepTokens", "%s", msg)
		}
	} else {
		conds.Set(v1beta1.ConditionDegraded, metav1.ConditionFalse, v1beta1.ReasonNamespacesLoggedIn,
			"identity Namespace: every namespace that holds leases through this connection keeps its tokens alive")
	}
	return held, nil
}
