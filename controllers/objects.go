package controllers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// reconcileObjects writes the objects the RedisCluster owns, Secrets first so that pods created
// from the StatefulSet find the credential they are annotated with.
func (r *RedisClusterReconciler) reconcileObjects(ctx context.Context, s *scope, cred *credential) error {
	rc := s.rc
	steps := []func() error{
		func() error { return r.ensureACLSecret(ctx, rc, cred) },
		func() error {
			if rc.Spec.Credentials.Source == v1alpha1.SourceExternalSecret {
				return nil // External Secrets Operator writes it
			}
			return ensure(ctx, r, rc, buildCredentialsSecret(rc, cred.username, cred.password, cred.version), &corev1.Secret{}, sameSecret, updateSecret)
		},
		func() error {
			return ensure(ctx, r, rc, buildConfigMap(rc), &corev1.ConfigMap{}, sameConfigMap, updateConfigMap)
		},
		func() error {
			return ensure(ctx, r, rc, buildHeadlessService(rc), &corev1.Service{}, sameService, updateService)
		},
		func() error {
			return ensure(ctx, r, rc, buildClientService(rc), &corev1.Service{}, sameService, updateService)
		},
		func() error {
			return ensure(ctx, r, rc, buildStatefulSet(rc, cred.version), &appsv1.StatefulSet{}, sameStatefulSet, updateStatefulSet)
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			var conflict *conflictError
			if errors.As(err, &conflict) {
				s.conds.set(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSecretConflict, err.Error())
			}
			return err
		}
	}
	return nil
}

// ensureACLSecret writes the aclfile the Redis pods load, and the reload user's password. cred is
// the current credential; nil leaves the current user out (its lease was revoked outside keyroll).
func (r *RedisClusterReconciler) ensureACLSecret(ctx context.Context, rc *v1alpha1.RedisCluster, cred *credential) error {
	old := &corev1.Secret{}
	err := r.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: aclSecretName(rc)}, old)
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	reload := string(old.Data[ReloadPasswordKey])
	if reload == "" {
		if reload, err = randomPassword(); err != nil {
			return err
		}
	}
	aclFile, err := aclFile(rc, cred, parseACLUsers(string(old.Data[ACLFileKey])), reload)
	if err != nil {
		return err
	}
	return ensure(ctx, r, rc, buildACLSecret(rc, aclFile, reload), &corev1.Secret{}, sameSecret, updateSecret)
}

// aclFile renders the aclfile: the current user (none while a revoked credential awaits its
// replacement), the users of superseded leases that are not revoked yet (taken over from the
// aclfile as it is, where only their password hashes are), and the reload user.
func aclFile(rc *v1alpha1.RedisCluster, cred *credential, existing map[string]aclUser, reloadPassword string) (string, error) {
	var users []aclUser
	if cred != nil {
		users = append(users, newACLUser(cred.username, cred.password))
	}
	keep := func(name string) {
		if u, ok := existing[name]; ok && !slices.ContainsFunc(users, func(x aclUser) bool { return x.Username == name }) {
			users = append(users, u)
		}
	}
	for _, l := range rc.Status.Leases {
		if l.State != v1alpha1.LeaseActive {
			keep(l.Username)
		}
	}
	if c := rc.Status.Credential; c != nil {
		for _, name := range c.SupersededUsers {
			keep(name)
		}
	}
	reload := newACLUser(reloadUser, reloadPassword)
	reload.Rules = reloadRules
	return renderACLFile(append(users, reload), rc.Spec.Credentials.ACLRules)
}

// randomPassword is 32 random bytes, hex-encoded.
func randomPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a password: %w", err)
	}
	return hex.EncodeToString(b), nil
}
