package credential

import (
	"context"
	"errors"
	"fmt"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/vault"
)

// ErrNoConnection says that no VaultConnection is known for a lease: keyroll cannot reach it.
var ErrNoConnection = errors.New("no VaultConnection to reach it through")

// ClientFor is the Vault client of the VaultConnection a lease came through: vcl, the spec's, or
// that other connection's.
func (l *Ledger) ClientFor(ctx context.Context, c *Cluster, vcl vault.LeaseClient, lease v1beta1.LeaseRecord) (vault.LeaseClient, error) {
	name := c.RC.LeaseConnection(lease)
	if name == c.RC.VaultConnectionName() || l.Connections == nil {
		if vcl == nil {
			return nil, fmt.Errorf("lease %s records no VaultConnection, and the spec names none: %w", lease.LeaseID, ErrNoConnection)
		}
		return vcl, nil
	}
	other, err := l.Connections.ClientOf(ctx, l.Reader, name, c.RC.Namespace)
	if err != nil {
		return nil, fmt.Errorf("VaultConnection %s, which lease %s came through: %w", name, lease.LeaseID, err)
	}
	return other, nil
}

// CurrentClient is the client of the VaultConnection the current lease came through (vcl, the
// spec's, unless the owner changed the connection since), and whether that is another connection
// than the spec names now (none included).
func (l *Ledger) CurrentClient(ctx context.Context, c *Cluster, vcl vault.LeaseClient) (vault.LeaseClient, bool, error) {
	cur := c.RC.Status.Credential
	if cur == nil || cur.Lease.LeaseID == "" {
		return vcl, false, nil
	}
	rec, ok := c.Lease(cur.Lease.LeaseID)
	if !ok {
		return vcl, false, nil
	}
	lvcl, err := l.ClientFor(ctx, c, vcl, rec)
	return lvcl, c.RC.LeaseConnection(rec) != c.RC.VaultConnectionName(), err
}
