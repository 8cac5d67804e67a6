package framework

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// ConsumerVersion is the credential version on a consumer Deployment's pod template.
func (f *Framework) ConsumerVersion(t testing.TB, ns, name string) string {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := f.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template.Annotations[v1beta1.AnnotationCredentialVersion]
}

// CheckRetired checks that a rotation away from the old credential is complete: the consumer and
// the consumers' Secret have the current one, which works in Vault's Redis and on every Redis
// node, while the old user logs in nowhere and its lease is gone from Vault. It returns the
// cluster as read then.
func (f *Framework) CheckRetired(t testing.TB, rc *v1beta1.RedisCluster, consumer, oldUser, oldPass, oldLease string) *v1beta1.RedisCluster {
	t.Helper()
	cur := f.Get(t, rc)
	if v := f.ConsumerVersion(t, rc.Namespace, consumer); v != cur.Status.Credential.Version {
		t.Errorf("consumer template annotation %q, want %q", v, cur.Status.Credential.Version)
	}
	if f.Authenticates(oldUser, oldPass) {
		t.Error("the old credential still works in Vault's Redis after the rollout")
	}
	if msg := f.OnEveryPod(rc, oldUser, oldPass, false); msg != "" {
		t.Errorf("after the rollout: %s", msg)
	}
	if len(cur.Status.RetiringUsers) > 0 {
		t.Errorf("status.retiringUsers %v after the rollout", cur.Status.RetiringUsers)
	}
	if exists, _ := f.LeaseExists(oldLease); exists {
		t.Error("the superseded lease is still live in Vault")
	}
	newUser, newPass, _ := f.Credentials(rc)
	if !f.Authenticates(newUser, newPass) || newUser == oldUser {
		t.Error("the new credential does not work in Vault's Redis")
	}
	if msg := f.OnEveryPod(rc, newUser, newPass, true); msg != "" {
		t.Error(msg)
	}
	return cur
}

// WaitRolledOut waits until rc's rollout is over and its ledger holds only the current lease,
// which is not oldLease, and returns the cluster as read then.
func (f *Framework) WaitRolledOut(t testing.TB, rc *v1beta1.RedisCluster, oldLease string, timeout time.Duration) *v1beta1.RedisCluster {
	t.Helper()
	var cur *v1beta1.RedisCluster
	Eventually(t, timeout, func() string {
		cur = f.Get(t, rc)
		if cur.Status.Rollout != nil || len(cur.Status.Leases) != 1 || cur.Status.Leases[0].LeaseID == oldLease {
			return fmt.Sprintf("rollout %+v, ledger %+v", cur.Status.Rollout, cur.Status.Leases)
		}
		return ""
	})
	return cur
}
