package rediscluster

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/controllers/render"
)

// reconcileUsers puts the cluster's users on every Redis node, live and node by node: first into
// the aclfile (so that a pod restarting meanwhile starts with them), then on each running node,
// confirmed there; only once every node accepts the current credential is it written to the
// consumers' Secret. aclRules that Redis has not accepted yet are checked on a node first: rules
// it refuses are reported, and nothing is applied. Once done, wait is when they are next checked.
func (r *deps) reconcileUsers(ctx context.Context, s *credential.Cluster, in *internal, cred *render.Credential) (done bool, wait time.Duration, err error) {
	rc := s.RC
	rulesKey := render.RulesKey(rc)
	if in.acl.Annotations[render.AnnotationRulesAccepted] != rulesKey {
		ok, wait, err := r.nodes.CheckRules(ctx, rc, s.Conds, render.AppRules(rc), in.Admin)
		if !ok || err != nil {
			return false, wait, err
		}
	}
	users := render.ClusterUsers(rc, in.Internal, render.AppUsers(rc, cred, render.ParseACLUsers(string(in.acl.Data[render.ACLFileKey]))))
	if err := r.writeACLSecret(ctx, rc, users, in, rulesKey); err != nil {
		return false, 0, err
	}
	r.nameCutOff(ctx, s, in)
	done, wait, err = r.nodes.Sync(ctx, rc, s.Conds, usersWant{Users: users, Confirm: cred, AdminPassword: in.Admin})
	if !done || err != nil || cred == nil {
		return done, wait, err
	}
	return true, wait, apply.Owned(ctx, r.Client, r.APIReader, rc, render.CredentialsSecret(rc, cred.Username, cred.Password, cred.Version, in.ca))
}

// writeACLSecret writes the aclfile of users, after the admin password whose hash it holds is in
// the state Secret; in holds the ACL Secret as written from then on.
func (r *deps) writeACLSecret(ctx context.Context, rc *v1beta1.RedisCluster, users render.Users, in *internal, rulesKey string) error {
	file, err := users.ACLFile()
	if err != nil {
		return err
	}
	if err := r.saveAdmin(ctx, rc, in); err != nil {
		return err
	}
	sec := render.ACLSecret(rc, file, in.Internal, rulesKey)
	if err := apply.Owned(ctx, r.Client, r.APIReader, rc, sec); err != nil {
		return err
	}
	in.acl = sec
	return nil
}

// internal are the passwords of keyroll's own users and the Vault plugin's user, with the ACL
// and state Secrets as they were read.
type internal struct {
	render.Internal
	acl, state *corev1.Secret
	// adminUnsaved says that the admin password was generated and is not in the state Secret yet.
	adminUnsaved bool
	// ca is the CA bundle of a TLS cluster's certificate, which the consumers' Secret carries;
	// tlsProblem says that the owner's certificate cannot be used (TLSReady says why), and the
	// nodes serve the last good one.
	ca         []byte
	tlsProblem bool
	// tlsLeaf is the certificate of <name>-tls, which every node is to serve (nil without TLS).
	tlsLeaf *x509.Certificate
}

// internalUsers reads the passwords of keyroll's own users, generating those that do not exist
// yet, and the Vault plugin's user. The admin password goes into the state Secret before any
// aclfile has its hash: at once when an aclfile exists, and for a new cluster with its first
// credential or just before its first aclfile, whichever comes first (saveAdmin); the others go
// into the ACL Secret with the aclfile. It returns nil without the Vault plugin's Secret.
func (r *deps) internalUsers(ctx context.Context, s *credential.Cluster) (*internal, error) {
	rc := s.RC
	state, err := r.ownedSecret(ctx, rc, render.StateSecretName(rc))
	if err != nil {
		return nil, err
	}
	acl, err := r.ownedSecret(ctx, rc, render.ACLSecretName(rc))
	if err != nil {
		return nil, err
	}
	in := &internal{acl: acl, state: state, Internal: render.Internal{Admin: string(state.Data[render.AdminPasswordKey]),
		Replication: string(acl.Data[render.ReplicationPasswordKey]), Probe: string(acl.Data[render.ProbePasswordKey])}}
	for _, p := range []*string{&in.Admin, &in.Replication, &in.Probe} {
		if *p == "" {
			if *p, err = render.RandomPassword(); err != nil {
				return nil, err
			}
		}
	}
	if string(state.Data[render.AdminPasswordKey]) != in.Admin {
		in.adminUnsaved = true
		if acl.Name != "" {
			if err := r.saveAdmin(ctx, rc, in); err != nil {
				return nil, err
			}
		}
	}
	if in.VaultPlugin, err = r.vaultPluginUser(ctx, s); err != nil || (rc.Spec.VaultPlugin != nil && in.VaultPlugin == nil) {
		return nil, err
	}
	return in, nil
}

// writeState writes the state Secret: the admin password and the staged credential (nil: none).
func (r *deps) writeState(ctx context.Context, rc *v1beta1.RedisCluster, in *internal, cred *render.Credential) error {
	if err := apply.Owned(ctx, r.Client, r.APIReader, rc, render.StateSecret(rc, in.Admin, cred)); err != nil {
		return err
	}
	in.adminUnsaved = false
	return nil
}

// saveAdmin writes a newly generated admin password into the state Secret, with the credential
// staged there as it was read, unless it is there already.
func (r *deps) saveAdmin(ctx context.Context, rc *v1beta1.RedisCluster, in *internal) error {
	if !in.adminUnsaved {
		return nil
	}
	return r.writeState(ctx, rc, in, render.StagedCredential(in.state))
}

// ownedSecret reads a Secret keyroll writes for rc (an empty one when it does not exist yet).
func (r *deps) ownedSecret(ctx context.Context, rc *v1beta1.RedisCluster, name string) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	err := r.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: name}, sec)
	if apierrors.IsNotFound(err) {
		return &corev1.Secret{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s: %w", name, err)
	}
	return sec, nil
}

// vaultPluginUser is the Vault plugin's user of spec.vaultPlugin: its password from the
// administrator's labelled Secret, or generated into <name>-vault-plugin; nil without one
// (UsersApplied says why).
func (r *deps) vaultPluginUser(ctx context.Context, s *credential.Cluster) (*render.ACLUser, error) {
	rc := s.RC
	vp := rc.Spec.VaultPlugin
	if vp == nil {
		return nil, nil
	}
	var password string
	if ref := vp.PasswordSecretRef; ref != nil {
		sec := &corev1.Secret{} // not in the cache, which holds keyroll's Secrets only
		err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: rc.Namespace, Name: ref.Name}, sec)
		if client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("reading Secret %s (spec.vaultPlugin.passwordSecretRef): %w", ref.Name, err)
		}
		// Only a Secret labelled for this cluster's plugin user: not any Secret of the namespace.
		reason, msg := v1beta1.ReasonSecretNotLabelled, fmt.Sprintf("spec.vaultPlugin.passwordSecretRef: Secret %s is not labelled %s=%s; keyroll uses only a Secret labelled for this cluster's plugin user", ref.Name, v1beta1.LabelVaultPluginPassword, rc.Name)
		if password = string(sec.Data[ref.Key]); password == "" {
			reason, msg = v1beta1.ReasonSecretNotFound, fmt.Sprintf("spec.vaultPlugin.passwordSecretRef: Secret %s has no key %q in namespace %s", ref.Name, ref.Key, rc.Namespace)
		}
		if password == "" || sec.Labels[v1beta1.LabelVaultPluginPassword] != rc.Name {
			if s.Conds.Set(v1beta1.ConditionUsersApplied, metav1.ConditionFalse, reason, msg) {
				s.Conds.Announce(true, v1beta1.ReasonSecretNotFound, "ApplyUsers", "%s", msg)
			}
			return nil, nil
		}
	} else {
		sec, err := r.ownedSecret(ctx, rc, render.VaultPluginSecretName(rc))
		if err != nil {
			return nil, err
		}
		password = string(sec.Data["password"])
		if password == "" {
			if password, err = render.RandomPassword(); err != nil {
				return nil, err
			}
		}
		if err := apply.Owned(ctx, r.Client, r.APIReader, rc, render.VaultPluginSecret(rc, vp.Username, password)); err != nil {
			return nil, err
		}
	}
	return &render.ACLUser{Username: vp.Username, PasswordHash: render.HashPassword(password)}, nil
}
