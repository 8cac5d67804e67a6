package connection

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// Until token Secret names carried a hash, a store's Secret was keyroll-tokens-<connection>, or
// keyroll-tokens-<connection>.<namespace> for a namespace's login, shortened with a hash past 253
// characters. Those names are ambiguous (a VaultConnection may be named vault.team-a), and the
// Secrets hold tokens that keep live leases alive: an upgrade moves them, and only those that
// verifiably are the store's (legacyOwn).

// legacyTokenSecretName is the name an earlier keyroll gave the Secret of connection and namespace.
func legacyTokenSecretName(connection, namespace string) string {
	name := tokenSecretPrefix + connection
	if namespace != "" {
		name += "." + namespace
	}
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(connection + "/" + namespace))
	return name[:253-17] + "-" + hex.EncodeToString(sum[:8])
}

// migrate moves the tokens kept in the store's Secret of an earlier keyroll into the current one:
// it writes them there first, then removes them from the old Secret (keyroll may not delete
// Secrets; the emptied one goes with its VaultConnection). It runs on every Load, so that tokens
// an earlier leader wrote there during the upgrade are moved too, on a later Load. A Secret at the
// old name that is another's is left alone.
func (s *tokenStore) migrate(ctx context.Context) (map[string]string, error) {
	key := types.NamespacedName{Namespace: s.key.Namespace, Name: legacyTokenSecretName(s.conn, s.identity)}
	if key == s.key {
		return nil, nil
	}
	sec := &corev1.Secret{}
	if err := s.reader.Get(ctx, key, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	if len(sec.Data) == 0 {
		return nil, nil // moved already, or nothing to move
	}
	if own, err := s.legacyOwn(sec); !own {
		return nil, err
	}
	tokens := make(map[string]string, len(sec.Data))
	for a, t := range sec.Data {
		tokens[a] = string(t)
	}
	if err := s.Save(ctx, tokens, nil); err != nil {
		return nil, err
	}
	if err := s.patch(ctx, sec, nil, slices.Sorted(maps.Keys(tokens))); err != nil {
		return nil, err
	}
	log.FromContext(ctx).Info("Moved Vault tokens to the token Secret's new name", "from", key.Name, "to", s.key.Name, "tokens", len(tokens))
	return tokens, nil
}

// legacyOwn says whether a Secret at the store's old name is the store's, and errs when that
// cannot be told. An old Secret names its connection in an annotation but not its namespace.
// The VaultConnection owning it (by UID) and named in its annotation rules out every other
// connection, vault.team-a's Secret for connection vault's team-a among them. Within one
// connection, an old name shorter than 253 characters stands for one namespace only; one of 253
// may be another namespace's name shortened (keyroll-tokens-vault.<x>-<hash> is namespace
// <x>-<hash>'s, or that of a longer namespace starting with x): keyroll takes it only once it
// carries the namespace annotation, which a person who checked it adds.
func (s *tokenStore) legacyOwn(sec *corev1.Secret) (bool, error) {
	if !ownedBy(sec, s.owner.UID) || sec.Annotations[v1beta1.LabelVaultConnection] != s.conn {
		return false, nil
	}
	if ns, ok := sec.Annotations[v1beta1.AnnotationVaultNamespaceIdentity]; ok {
		return ns == s.identity, nil
	}
	if len(sec.Name) < 253 {
		return true, nil
	}
	return false, fmt.Errorf("cannot tell whose Vault tokens Secret %s/%s holds: an earlier keyroll kept there those of VaultConnection %q for the connection itself or for one namespace, and a name of 253 characters does not say which; "+
		"annotate it %s=<that namespace> (empty for the connection's own) and keyroll moves them to where it keeps them now",
		sec.Namespace, sec.Name, s.conn, v1beta1.AnnotationVaultNamespaceIdentity)
}
