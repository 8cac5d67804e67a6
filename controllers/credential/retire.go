package credential

import (
	"slices"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// Retire is called once the current credential runs everywhere: the superseded leases are to be
// revoked (Revoking), and their users, with those of replaced credentials without a tracked
// lease, are to leave every node (status.retiringUsers); but for the held users (clients that
// are not listed consumers are still logged in with them), whose leases stay Superseded, kept
// alive, and who retire on their own later.
func Retire(rc *v1beta1.RedisCluster, held ...string) {
	for _, u := range UsersToRetire(rc) {
		if !slices.Contains(held, u) {
			rc.Status.RetiringUsers = append(rc.Status.RetiringUsers, u)
		}
	}
	for i := range rc.Status.Leases {
		if l := &rc.Status.Leases[i]; l.State == v1beta1.LeaseSuperseded && !slices.Contains(held, l.Username) {
			l.State = v1beta1.LeaseRevoking
		}
	}
	if c := rc.Status.Credential; c != nil {
		c.SupersededUsers = slices.DeleteFunc(slices.Clone(c.SupersededUsers), func(u string) bool { return !slices.Contains(held, u) })
		if len(c.SupersededUsers) == 0 {
			c.SupersededUsers = nil
		}
	}
}

// Gone are the users that stay on the nodes only until the rollout is done although their lease
// is gone from Vault (revoked outside keyroll, or ended: onRevokedOutside RollOver). Nothing keeps
// them alive for clients: they retire whoever is still logged in with them.
func Gone(rc *v1beta1.RedisCluster) []string {
	c := rc.Status.Credential
	if c == nil || (c.Source == v1beta1.SourceExternalSecret && (c.ExternalSecret.LeasesTracked == nil || !*c.ExternalSecret.LeasesTracked)) {
		return nil // without tracked leases, supersededUsers are replaced credentials whose lease keyroll does not know
	}
	return c.SupersededUsers
}

// UsersToRetire are the users Retire takes off the nodes next: those of the superseded leases and
// credentials, once each, but for users already retiring and the current credential's.
func UsersToRetire(rc *v1beta1.RedisCluster) []string {
	return slices.DeleteFunc(rc.SupersededUsernames(), func(name string) bool {
		return slices.Contains(rc.Status.RetiringUsers, name) || (rc.Status.Credential != nil && rc.Status.Credential.Username == name)
	})
}
