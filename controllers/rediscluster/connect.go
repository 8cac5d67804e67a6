package rediscluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/vault"
)

// waitForConnection is how long a RedisCluster waits before it looks again at a VaultConnection
// that is missing or refuses it (a change of the VaultConnection wakes it earlier).
const waitForConnection = time.Minute

// connect resolves the RedisCluster's VaultConnection and returns its Vault client. Without a
// client it sets a condition, records an event on the transition and says when to look again.
// forDelete skips the namespace check: revoking leases keyroll already holds is always allowed.
func (r *deps) connect(ctx context.Context, s *scope, forDelete bool) (vault.LeaseClient, time.Duration, error) {
	rc := s.RC
	name := rc.VaultConnectionName()
	vc := &v1alpha1.VaultConnection{}
	if err := r.Get(ctx, client.ObjectKey{Name: name}, vc); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, 0, fmt.Errorf("reading VaultConnection %s: %w", name, err)
		}
		r.refuse(s, v1alpha1.ReasonConnectionNotFound, fmt.Sprintf("VaultConnection %q (%s) does not exist", name, rc.VaultConnectionField()))
		return nil, waitForConnection, nil
	}
	if !forDelete && !vc.AllowsNamespace(rc.Namespace) {
		r.refuse(s, v1alpha1.ReasonNamespaceNotAllowed, fmt.Sprintf("VaultConnection %q does not allow namespace %q (spec.allowedNamespaces)", name, rc.Namespace))
		return nil, waitForConnection, nil
	}
	vcl, err := r.Connector.Client(ctx, vc)
	if err != nil {
		r.refuse(s, v1alpha1.ReasonConnectionNotReady, fmt.Sprintf("VaultConnection %q cannot be used: %v", name, err))
		return nil, waitForConnection, nil
	}
	return vcl, 0, nil
}

// connectTo is a Vault client of the VaultConnection name, for the leases that came through it
// while the spec names another (the in-use finalizer keeps it while the ledger holds them).
func (r *deps) connectTo(ctx context.Context, name string) (vault.LeaseClient, error) {
	vc := &v1alpha1.VaultConnection{}
	if err := r.Get(ctx, client.ObjectKey{Name: name}, vc); err != nil {
		return nil, fmt.Errorf("reading VaultConnection %s: %w", name, err)
	}
	return r.Connector.Client(ctx, vc)
}

// refuse marks the credential as not ready for a reason the RedisCluster owner must act on.
func (r *deps) refuse(s *scope, reason, message string) {
	s.NotReady(reason, v1alpha1.EventAccessDenied, "Connect", message, true)
}

// checkSecretsFree makes sure the Secrets keyroll writes are either absent or its own, before a
// credential is issued that could not be written anywhere.
func (r *deps) checkSecretsFree(ctx context.Context, s *scope) (bool, error) {
	names := []string{render.CredentialsSecretName(s.RC), render.ACLSecretName(s.RC), render.StateSecretName(s.RC)}
	if vp := s.RC.Spec.VaultPlugin; vp != nil && vp.PasswordSecretRef == nil {
		names = append(names, render.VaultPluginSecretName(s.RC))
	}
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names { // at once: each may be a read past the cache
		wg.Go(func() { errs[i] = r.secretOwned(ctx, s.RC, name) })
	}
	wg.Wait()
	for _, err := range errs {
		var conflict *apply.ConflictError
		if errors.As(err, &conflict) {
			s.NotReady(v1alpha1.ReasonSecretConflict, v1alpha1.EventSecretConflict, "WriteSecret", err.Error(), true)
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

// secretOwned says whether a Secret is absent or controlled by rc. The cache only holds Secrets
// that carry keyroll's label, so a Secret it does not have is looked up past the cache.
func (r *deps) secretOwned(ctx context.Context, rc *v1alpha1.RedisCluster, name string) error {
	sec := &corev1.Secret{}
	key := client.ObjectKey{Namespace: rc.Namespace, Name: name}
	err := r.Get(ctx, key, sec)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, sec)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("reading Secret %s: %w", name, err)
	case !apply.OwnedBy(sec, rc) && !render.SyncedByExternalSecret(sec, rc):
		return &apply.ConflictError{Kind: "Secret", Name: name}
	}
	return nil
}
