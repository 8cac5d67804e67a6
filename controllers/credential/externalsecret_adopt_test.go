package credential

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/rotation"
	"github.com/keyroll/keyroll/vault"
)

// TestSyncedCredentialKeepsTheReasonOfTheRequestItAnswers: the reason keyroll asked ESO for a new
// credential (status.credential.rotationReason) stays with the current credential and passes to
// the one that answers the request; a credential ESO refreshed on its own carries none.
func TestSyncedCredentialKeepsTheReasonOfTheRequestItAnswers(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
	requested := metav1.NewTime(now.Add(-time.Minute))
	for name, tc := range map[string]struct {
		prev  *v1beta1.CredentialStatus
		fresh bool
		want  string
	}{
		"the first credential": {fresh: true, want: ""},
		"the credential that answers a request": {
			prev:  &v1beta1.CredentialStatus{Version: "v1", ExternalSecret: v1beta1.ExternalSecretCredential{RefreshRequestedAt: &requested}, RotationReason: string(rotation.ReasonRenewalCapped)},
			fresh: true, want: string(rotation.ReasonRenewalCapped),
		},
		"the same credential, while the request is pending": {
			prev:  &v1beta1.CredentialStatus{Version: "v2", ExternalSecret: v1beta1.ExternalSecretCredential{RefreshRequestedAt: &requested}, RotationReason: string(rotation.ReasonTokenEnding)},
			fresh: false, want: string(rotation.ReasonTokenEnding),
		},
		"a credential ESO refreshed on its own": {
			prev:  &v1beta1.CredentialStatus{Version: "v1", RotationReason: string(rotation.ReasonScheduledRotation)},
			fresh: true, want: "",
		},
	} {
		t.Run(name, func(t *testing.T) {
			rc := &v1beta1.RedisCluster{Status: v1beta1.RedisClusterStatus{Credential: tc.prev}}
			sc := &render.SyncedCredential{Credential: render.Credential{Username: "v-orders-2", Password: "pw", Version: "v2"}}
			r := &Adopter{Clock: testclock.NewFakeClock(now.Time)}
			r.recordSynced(&Cluster{RC: rc}, sc, false, &vault.LeaseInfo{Exists: true}, &now, tc.fresh)
			if got := rc.Status.Credential.RotationReason; got != tc.want {
				t.Errorf("rotationReason %q, want %q", got, tc.want)
			}
		})
	}
}

// A tracked lease of ExternalSecret mode is recorded with the VaultConnection it is tracked
// through, so that after a change (or removal) of connectionRef it is still renewed and revoked
// through that one; the lease it replaces is marked superseded by the new credential.
func TestTrackedLeaseRecordsItsConnection(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
	rc := &v1beta1.RedisCluster{}
	rc.Spec.Credentials.ExternalSecret = &v1beta1.ExternalSecretSource{ConnectionRef: &v1beta1.ConnectionReference{Name: "vault-a"}}
	rc.Status.Leases = []v1beta1.LeaseRecord{{LeaseID: "old", State: v1beta1.LeaseActive, Connection: "vault-a"}}
	sc := &render.SyncedCredential{Credential: render.Credential{Username: "v-orders-2", Password: "pw", Version: "v2"}, LeaseID: "new"}
	r := &Adopter{Clock: testclock.NewFakeClock(now.Time)}
	r.recordSynced(&Cluster{RC: rc}, sc, true, &vault.LeaseInfo{Exists: true, ExpiresAt: now.Add(time.Hour)}, &now, true)
	rec, ok := map[string]v1beta1.LeaseRecord{}, false
	for _, l := range rc.Status.Leases {
		rec[l.LeaseID] = l
	}
	if _, ok = rec["new"]; !ok || rec["new"].Connection != "vault-a" || rec["new"].State != v1beta1.LeaseActive {
		t.Errorf("the new lease's record %+v: want Active through vault-a", rec["new"])
	}
	if rec["old"].State != v1beta1.LeaseSuperseded || rec["old"].SupersededBy != "v2" {
		t.Errorf("the old lease's record %+v: want Superseded by v2", rec["old"])
	}
	rc.Spec.Credentials.ExternalSecret.ConnectionRef = nil
	if got := rc.LeaseConnection(rec["new"]); got != "vault-a" {
		t.Errorf("without connectionRef the lease's connection is %q, want vault-a", got)
	}
}
