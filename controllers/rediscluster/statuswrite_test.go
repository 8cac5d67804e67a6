package rediscluster

import (
	"context"
	"errors"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// The status write that records a newly issued lease in the ledger fails: the API server answers
// 500 or times out after committing it, or refuses it (500 before commit). Whatever the client
// saw, once the reconciler has settled Vault holds exactly the leases of the ledger, one, and the
// consumers' Secret holds that lease's credential: no lease leaked, no second credential in use.
func TestLedgerWriteFailsAfterIssue(t *testing.T) {
	cases := map[string]struct {
		commit bool
		err    error
	}{
		"500 after commit":     {true, apierrors.NewInternalError(errors.New("etcd leader changed"))},
		"timeout after commit": {true, apierrors.NewTimeoutError("request did not complete within the allowed duration", 1)},
		"500 before commit":    {false, apierrors.NewInternalError(errors.New("etcd leader changed"))},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, cluster())
			failed := false
			h.r = h.r.WithClient(interceptor.NewClient(h.k8s.(client.WithWatch), interceptor.Funcs{
				SubResourcePatch: func(ctx context.Context, c client.Client, s string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
					rc, ok := o.(*v1beta1.RedisCluster)
					if failed || !ok || len(rc.Status.Leases) == 0 {
						return c.SubResource(s).Patch(ctx, o, p, opts...)
					}
					failed = true // the first write of a lease into the ledger
					if tc.commit {
						if err := c.SubResource(s).Patch(ctx, o, p, opts...); err != nil {
							return err
						}
					}
					return tc.err
				},
			}))
			for range 12 {
				_, _ = h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "orders"}})
			}
			if !failed {
				t.Fatal("no ledger write was failed")
			}
			rc := h.settle(t)
			var held []string
			for _, l := range rc.Status.Leases {
				held = append(held, l.LeaseID)
			}
			slices.Sort(held)
			if live := h.vault.Leases(); !slices.Equal(live, held) || len(held) != 1 {
				t.Errorf("Vault holds %v, the ledger %v: want the same single lease", live, held)
			}
			c := rc.Status.Credential
			if c == nil || len(held) != 1 || c.Lease.LeaseID != held[0] {
				t.Fatalf("the current credential %+v is not the ledger's lease %v", c, held)
			}
			if u := string(h.secret(t, "orders-credentials").Data["username"]); u != c.Username {
				t.Errorf("the consumers' Secret holds %q, the current credential is %q", u, c.Username)
			}
			if issued := h.vault.Calls("issue"); issued > 2 {
				t.Errorf("%d credentials issued for one due issuance and one lost write, want at most 2", issued)
			}
		})
	}
}
