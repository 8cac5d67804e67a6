package rediscluster

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/controllers/status"
)

// A credential is delivered once every Redis node accepts it (the users step confirmed it on
// each), the consumers' Secret holds it, and every pod and consumer runs it (the rollout is done;
// a first credential has none). status.credential.deliveredAt records when: a scheduled rotation
// waits for it and counts the schedule from it (rotation.Decide), so that a credential is never
// replaced before anyone could have used it.

// deliveredBefore says, ahead of the users step that may publish cred, whether the current
// credential was delivered in an earlier reconcile that did not record when: by a keyroll before
// status.credential.deliveredAt, or in a reconcile whose status write was lost. The consumers'
// Secret holds it already and no rollout runs. The Secret is read only while deliveredAt is unset.
func (r *deps) deliveredBefore(ctx context.Context, rc *v1beta1.RedisCluster, cred *render.Credential) bool {
	c := rc.Status.Credential
	if c == nil || c.DeliveredAt != nil || c.Version != cred.Version || rc.Status.Rollout != nil {
		return false
	}
	sec := &corev1.Secret{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: render.CredentialsSecretName(rc)}, sec); err != nil {
		return false // not there yet, or unreadable: if it is delivered, it is delivered now
	}
	return apply.OwnedBy(sec, rc) && sec.Annotations[v1beta1.AnnotationCredentialVersion] == cred.Version
}

// delivered records that cred, the current credential, has been delivered: now, or, when it was
// delivered before at a time no one recorded (before), at its issue, the earliest it can have
// been. The earliest, so that a scheduled rotation that came due while the operator was down or
// being upgraded still comes at once, as it did before deliveries were recorded. It returns how
// soon to look again: at once after a delivery recorded in the past, which this reconcile's
// decision (made before it) did not count from.
func (r *deps) delivered(rc *v1beta1.RedisCluster, cred *render.Credential, before bool) time.Duration {
	c := rc.Status.Credential
	if c == nil || c.DeliveredAt != nil || c.Version != cred.Version {
		return 0
	}
	c.DeliveredAt = status.At(r.Clock.Now())
	if !before || c.IssuedAt == nil {
		return 0
	}
	c.DeliveredAt = c.IssuedAt.DeepCopy()
	return decideAgain
}

// decideAgain is how soon a cluster is looked at again once its credential's delivery was recorded
// in the past.
const decideAgain = time.Millisecond
