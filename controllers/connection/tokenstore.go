package connection

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/vault"
)

var _ vault.TokenStore = (*tokenStore)(nil)

// tokenStore keeps the Vault tokens of one VaultConnection in a Secret of the operator's own
// namespace (keyroll-tokens-<connection>), so that a restarted operator or a new leader takes over
// the tokens that keep leases alive. Its data holds the tokens, by accessor; its labels and
// annotations name the connection and never hold a token. The VaultConnection owns it: it goes
// with the connection, which keyroll deletes only once no lease obtained through it is left.
type tokenStore struct {
	writer client.Client
	reader client.Reader // past the cache: the freshest copy
	key    types.NamespacedName
	owner  metav1.OwnerReference
	conn   string
}

// tokenSecretName is the name of the Secret holding a VaultConnection's tokens, or with identity
// Namespace those of one namespace's login (keyroll-tokens-<connection>.<namespace>: a namespace
// name holds no dot, so no two pairs share a name).
func tokenSecretName(connection, namespace string) string {
	name := "keyroll-tokens-" + connection
	if namespace != "" {
		name += "." + namespace
	}
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(connection + "/" + namespace))
	return name[:253-17] + "-" + hex.EncodeToString(sum[:8])
}

func newTokenStore(writer client.Client, reader client.Reader, namespace string, vc *v1beta1.VaultConnection, identity string) *tokenStore {
	return &tokenStore{
		writer: writer, reader: reader, conn: vc.Name,
		key: types.NamespacedName{Namespace: namespace, Name: tokenSecretName(vc.Name, identity)},
		owner: metav1.OwnerReference{APIVersion: v1beta1.GroupVersion.String(), Kind: "VaultConnection",
			Name: vc.Name, UID: vc.UID},
	}
}

// Load returns the stored tokens, accessor to token.
func (s *tokenStore) Load(ctx context.Context) (map[string]string, error) {
	sec := &corev1.Secret{}
	if err := s.reader.Get(ctx, s.key, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Secret %s: %w", s.key, err)
	}
	out := make(map[string]string, len(sec.Data))
	for a, t := range sec.Data {
		out[a] = string(t)
	}
	return out, nil
}

// Save adds and removes tokens with a merge patch of the Secret's data, key by key, so that two
// writers (a leader and its successor, for a moment) never drop each other's tokens. It creates
// the Secret on first use.
func (s *tokenStore) Save(ctx context.Context, put map[string]string, drop []string) error {
	data := make(map[string]any, len(put)+len(drop))
	for _, a := range drop {
		data[a] = nil
	}
	for a, t := range put {
		data[a] = base64.StdEncoding.EncodeToString([]byte(t))
	}
	patch, err := json.Marshal(map[string]any{"data": data})
	if err != nil {
		return err
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.key.Namespace, Name: s.key.Name}}
	err = s.writer.Patch(ctx, sec, client.RawPatch(types.MergePatchType, patch))
	if apierrors.IsNotFound(err) && len(put) > 0 {
		err = s.create(ctx, put)
		if apierrors.IsAlreadyExists(err) {
			err = s.writer.Patch(ctx, sec, client.RawPatch(types.MergePatchType, patch))
		}
	}
	if apierrors.IsNotFound(err) {
		return nil // nothing to drop
	}
	if err != nil {
		return fmt.Errorf("writing Secret %s: %w", s.key, err)
	}
	return nil
}

func (s *tokenStore) create(ctx context.Context, put map[string]string) error {
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.key.Namespace, Name: s.key.Name,
			Labels:          map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue},
			Annotations:     map[string]string{v1beta1.LabelVaultConnection: s.conn},
			OwnerReferences: []metav1.OwnerReference{s.owner},
		},
		Type: corev1.SecretTypeOpaque,
		Data: make(map[string][]byte, len(put)),
	}
	for a, t := range put {
		sec.Data[a] = []byte(t)
	}
	return s.writer.Create(ctx, sec)
}
