package controllers

import (
	"context"
	"errors"

	"github.com/keyroll/keyroll/controllers/render"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// reconcileObjects writes the objects the RedisCluster owns, Secrets first so that pods created
// from the StatefulSet find the credential they are annotated with.
func (r *RedisClusterReconciler) reconcileObjects(ctx context.Context, s *scope, cred *render.Credential) error {
	rc := s.rc
	steps := []func() error{
		func() error { return r.ensureACLSecret(ctx, rc, cred) },
		func() error {
			if rc.Spec.Credentials.Source == v1alpha1.SourceExternalSecret {
				return nil // External Secrets Operator writes it
			}
			return ensure(ctx, r, rc, render.CredentialsSecret(rc, cred.Username, cred.Password, cred.Version), &corev1.Secret{}, sameSecret, updateSecret)
		},
		func() error {
			return ensure(ctx, r, rc, render.ConfigMap(rc), &corev1.ConfigMap{}, sameConfigMap, updateConfigMap)
		},
		func() error {
			return ensure(ctx, r, rc, render.HeadlessService(rc), &corev1.Service{}, sameService, updateService)
		},
		func() error {
			return ensure(ctx, r, rc, render.ClientService(rc), &corev1.Service{}, sameService, updateService)
		},
		func() error {
			return ensure(ctx, r, rc, render.StatefulSet(rc, cred.Version), &appsv1.StatefulSet{}, sameStatefulSet, updateStatefulSet)
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
func (r *RedisClusterReconciler) ensureACLSecret(ctx context.Context, rc *v1alpha1.RedisCluster, cred *render.Credential) error {
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
	return ensure(ctx, r, rc, render.ACLSecret(rc, aclFile, reload), &corev1.Secret{}, sameSecret, updateSecret)
}
