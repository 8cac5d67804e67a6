package credential

import (
	"fmt"
	"testing"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
)

// TestRefreshesPauseBeforeTheStatusIsFull: External Secrets Operator's refreshes pause (refreshPolicy
// CreatedOnce) while the ledger or the superseded users are within their margin of the CRD's
// bounds, and a credential that would take either past its bound is not adopted.
func TestRefreshesPauseBeforeTheStatusIsFull(t *testing.T) {
	withLeases := func(n int) *v1beta1.RedisCluster {
		rc := &v1beta1.RedisCluster{}
		for i := range n {
			rc.Status.Leases = append(rc.Status.Leases, v1beta1.LeaseRecord{LeaseID: fmt.Sprintf("database/creds/orders/%d", i), State: v1beta1.LeaseSuperseded})
		}
		return rc
	}
	withUsers := func(n int) *v1beta1.RedisCluster {
		rc := &v1beta1.RedisCluster{Status: v1beta1.RedisClusterStatus{Credential: &v1beta1.CredentialStatus{}}}
		for i := range n {
			rc.Status.Credential.SupersededUsers = append(rc.Status.Credential.SupersededUsers, fmt.Sprintf("u%d", i))
		}
		return rc
	}
	for name, tc := range map[string]struct {
		rc             *v1beta1.RedisCluster
		add            int
		tracked        bool
		paused, adopts bool
	}{
		"room":                             {rc: withLeases(3), add: 1, tracked: true, adopts: true},
		"within the lease margin":          {rc: withLeases(MaxLeases - pauseLeaseMargin), add: 1, tracked: true, paused: true, adopts: true},
		"the last lease that fits":         {rc: withLeases(MaxLeases - 1), add: 1, tracked: true, paused: true, adopts: true},
		"a lease past the bound":           {rc: withLeases(MaxLeases - 1), add: 2, tracked: true, paused: true},
		"users with room":                  {rc: withUsers(3), adopts: true},
		"within the user margin":           {rc: withUsers(MaxSupersededUsers - pauseUserMargin), paused: true, adopts: true},
		"a superseded user past the bound": {rc: withUsers(MaxSupersededUsers), paused: true},
	} {
		t.Run(name, func(t *testing.T) {
			if got := refreshesPaused(tc.rc); got != tc.paused {
				t.Errorf("refreshesPaused = %v, want %v", got, tc.paused)
			}
			es := &externalsecrets.ExternalSecret{Spec: externalsecrets.ExternalSecretSpec{RefreshPolicy: externalsecrets.RefreshPolicyPeriodic}}
			pauseRefreshes(tc.rc, es)
			if paused := es.Spec.RefreshPolicy == externalsecrets.RefreshPolicyCreatedOnce; paused != tc.paused {
				t.Errorf("rendered refreshPolicy %q, want paused %v", es.Spec.RefreshPolicy, tc.paused)
			}
			if got := fits(tc.rc, tc.add, tc.tracked); got != tc.adopts {
				t.Errorf("fits = %v, want %v", got, tc.adopts)
			}
		})
	}
}

// TestNewLeasesCountsEachLeaseOnce: the current lease seen among the sightings, and leases already
// in the ledger, are not counted twice against the bound.
func TestNewLeasesCountsEachLeaseOnce(t *testing.T) {
	rc := &v1beta1.RedisCluster{Status: v1beta1.RedisClusterStatus{Leases: []v1beta1.LeaseRecord{{LeaseID: "a"}}}}
	if n := newLeases(rc, []string{"a", "b", "c"}, "c"); n != 2 {
		t.Errorf("newLeases = %d, want 2 (b and c)", n)
	}
}
