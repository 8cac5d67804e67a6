package rediscluster

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/vault"
)

// waitForConnection is how long a RedisCluster waits before it looks again at a VaultConnection
// that is missing or refuses it (a change of the VaultConnection wakes it earlier).
const waitForConnection = time.Minute

// connect resolves the RedisCluster's VaultConnection and returns its Vault client, confined to
// what the namespace may do; without one it sets a condition (and an event) and says when to look
// again. forDelete asks for revocations only (the client checks each lease).
func (r *deps) connect(ctx context.Context, s *credential.Cluster, forDelete bool) (vault.LeaseClient, time.Duration, error) {
	rc := s.RC
	use := connection.Use{Connection: rc.VaultConnectionName(), Field: rc.VaultConnectionField(), Namespace: rc.Namespace, Delete: forDelete}
	if vl := rc.Spec.Credentials.VaultLease; vl != nil && !forDelete {
		use.Path, use.PathField = vl.Path, "credentials.vaultLease.path"
	}
	vcl, refusal, err := r.Connector.ClientFor(ctx, r.Client, use)
	if err != nil || refusal == nil {
		return vcl, 0, err
	}
	s.NotReady(refusal.Reason, v1beta1.EventAccessDenied, "Connect", refusal.Message, true)
	return nil, waitForConnection, nil
}

// checkSecretsFree makes sure the Secrets keyroll writes are either absent or its own, before a
// credential is issued that could not be written anywhere.
func (r *deps) checkSecretsFree(ctx context.Context, s *credential.Cluster) (bool, error) {
	names := []string{render.CredentialsSecretName(s.RC), render.ACLSecretName(s.RC), render.StateSecretName(s.RC)}
	if vp := s.RC.Spec.VaultPlugin; vp != nil && vp.PasswordSecretRef == nil {
		names = append(names, render.VaultPluginSecretName(s.RC))
	}
	if render.TLSEnabled(s.RC) {
		names = append(names, render.TLSSecretName(s.RC))
	}
	if render.OwnCertificate(s.RC) {
		names = append(names, render.TLSCASecretName(s.RC))
	}
	err := apply.SecretsFree(ctx, r.Client, r.APIReader, s.RC, names, func(sec *corev1.Secret) bool { return render.SyncedByExternalSecret(sec, s.RC) })
	var conflict *apply.ConflictError
	if errors.As(err, &conflict) {
		s.NotReady(v1beta1.ReasonSecretConflict, v1beta1.EventSecretConflict, "WriteSecret", conflict.Error(), true)
		return false, nil
	}
	return err == nil, err
}
