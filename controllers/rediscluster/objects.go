package rediscluster

import (
	"context"
	"errors"

	"github.com/keyroll/keyroll/controllers/apply"

	"github.com/keyroll/keyroll/controllers/render"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// reconcileObjects writes the objects the RedisCluster owns, Secrets first so that pods created
// from the StatefulSet find the credential they are annotated with.
func (r *deps) reconcileObjects(ctx context.Context, s *scope, cred *render.Credential) error {
	rc := s.RC
	steps := []func() error{
		func() error { return r.ensureACLSecret(ctx, rc, cred) },
		func() error {
			if rc.Spec.Credentials.Source == v1alpha1.SourceExternalSecret {
				return nil // External Secrets Operator writes it
			}
			return apply.Owned(ctx, r.Client, r.APIReader, rc, render.CredentialsSecret(rc, cred.Username, cred.Password, cred.Version))
		},
		func() error {
			return apply.Owned(ctx, r.Client, r.APIReader, rc, render.ConfigMap(rc))
		},
		func() error {
			return apply.Owned(ctx, r.Client, r.APIReader, rc, render.HeadlessService(rc))
		},
		func() error {
			return apply.Owned(ctx, r.Client, r.APIReader, rc, render.ClientService(rc))
		},
		func() error {
			return apply.Owned(ctx, r.Client, r.APIReader, rc, render.StatefulSet(rc, cred.Version))
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			var conflict *apply.ConflictError
			if errors.As(err, &conflict) {
				s.conflict = err.Error()
			}
			return err
		}
	}
	return nil
}

// ensureACLSecret writes the aclfile the Redis pods load, and the reload user's password. cred is
// the current credential; nil leaves the current user out (its lease was revoked outside keyroll).
func (r *deps) ensureACLSecret(ctx context.Context, rc *v1alpha1.RedisCluster, cred *render.Credential) error {
	old := &corev1.Secret{}
	err := r.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: render.ACLSecretName(rc)}, old)
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	reload := string(old.Data[render.ReloadPasswordKey])
	if reload == "" {
		if reload, err = render.RandomPassword(); err != nil {
			return err
		}
	}
	aclFile, err := render.ACLFile(rc, cred, render.ParseACLUsers(string(old.Data[render.ACLFileKey])), reload)
	if err != nil {
		return err
	}
	return apply.Owned(ctx, r.Client, r.APIReader, rc, render.ACLSecret(rc, aclFile, reload))
}
