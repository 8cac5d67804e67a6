package credential

import (
	"slices"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// Retire is called once the current credential runs everywhere: the superseded leases are to be
// revoked (Revoking), and their users, with those of replaced credentials without a tracked
// lease, are to leave every node (status.retiringUsers).
func Retire(rc *v1beta1.RedisCluster) {
	rc.Status.RetiringUsers = append(rc.Status.RetiringUsers, UsersToRetire(rc)...)
	for i := range rc.Status.Leases {
		if l := &rc.Status.Leases[i]; l.State == v1beta1.LeaseSuperseded {
			l.State = v1beta1.LeaseRevoking
		}
	}
	if c := rc.Status.Credential; c != nil {
		c.SupersededUsers = nil
	}
}

// UsersToRetire are the users Retire takes off the nodes next: those of the superseded leases and
// credentials, once each, but for users already retiring and the current credential's.
func UsersToRetire(rc *v1beta1.RedisCluster) []string {
	return slices.DeleteFunc(rc.SupersededUsernames(), func(name string) bool {
		return slices.Contains(rc.Status.RetiringUsers, name) || (rc.Status.Credential != nil && rc.Status.Credential.Username == name)
	})
}
