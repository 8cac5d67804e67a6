package externalsecret

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers/ledger"
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
		prev  *v1alpha1.CredentialStatus
		fresh bool
		want  string
	}{
		"the first credential": {fresh: true, want: ""},
		"the credential that answers a request": {
			prev:  &v1alpha1.CredentialStatus{Version: "v1", RefreshRequestedAt: &requested, RotationReason: string(rotation.ReasonRenewalCapped)},
			fresh: true, want: string(rotation.ReasonRenewalCapped),
		},
		"the same credential, while the request is pending": {
			prev:  &v1alpha1.CredentialStatus{Version: "v2", RefreshRequestedAt: &requested, RotationReason: string(rotation.ReasonTokenEnding)},
			fresh: false, want: string(rotation.ReasonTokenEnding),
		},
		"a credential ESO refreshed on its own": {
			prev:  &v1alpha1.CredentialStatus{Version: "v1", RotationReason: string(rotation.ReasonScheduledRotation)},
			fresh: true, want: "",
		},
	} {
		t.Run(name, func(t *testing.T) {
			rc := &v1alpha1.RedisCluster{Status: v1alpha1.RedisClusterStatus{Credential: tc.prev}}
			sc := &render.SyncedCredential{Credential: render.Credential{Username: "v-orders-2", Password: "pw", Version: "v2"}}
			r := &Source{Clock: testclock.NewFakeClock(now.Time)}
			r.recordSynced(&ledger.Cluster{RC: rc}, sc, false, &vault.LeaseInfo{Exists: true}, &now, tc.fresh)
			if got := rc.Status.Credential.RotationReason; got != tc.want {
				t.Errorf("rotationReason %q, want %q", got, tc.want)
			}
		})
	}
}
