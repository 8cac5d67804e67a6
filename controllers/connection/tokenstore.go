package connection

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/vault"
)

var _ vault.TokenStore = (*tokenStore)(nil)

// tokenStore keeps the Vault tokens of one VaultConnection, or of one namespace's login through it
// (identity Namespace), in a Secret of the operator's own namespace (TokenSecretName), so that a
// restarted operator or a new leader takes over the tokens that keep leases alive. Its data holds
// the tokens, by accessor; its annotations name the connection and the namespace and never hold a
// token. The VaultConnection owns it: it goes with the connection, which keyroll deletes only once
// no lease obtained through it is left. The store reads and writes only a Secret that is its own
// (belongs): another found at its name is refused, never used and never changed.
type tokenStore struct {
	writer   client.Client
	reader   client.Reader // past the cache: the freshest copy
	key      types.NamespacedName
	owner    metav1.OwnerReference
	conn     string
	identity string // the namespace whose login this is; "": the connection's own
}

const tokenSecretPrefix = "keyroll-tokens-"

// TokenSecretName is the name of the Secret holding the Vault tokens of VaultConnection
// connection, or with identity Namespace those of namespace's login ("": the connection's own):
// keyroll-tokens-<connection>[.<namespace>]-<hash>, where the readable part is shortened to keep
// within 253 characters and the hash (128 bits of SHA-256) is over the pair written so that it
// reads back one way only (the connection's length first). A connection's name may hold dots, so
// the readable part alone could name two pairs (connection vault.team-a, and namespace team-a of
// connection vault); the hash tells them apart.
func TokenSecretName(connection, namespace string) string {
	pair := strconv.Itoa(len(connection)) + ":" + connection + "/" + namespace
	sum := sha256.Sum256([]byte(pair))
	hash := hex.EncodeToString(sum[:16])
	readable := connection
	if namespace != "" {
		readable += "." + namespace
	}
	if room := 253 - len(tokenSecretPrefix) - len("-") - len(hash); len(readable) > room {
		// A label of a DNS subdomain neither starts nor ends with '-', nor is it empty.
		readable = strings.TrimRight(readable[:room], ".-")
	}
	return tokenSecretPrefix + readable + "-" + hash
}

func newTokenStore(writer client.Client, reader client.Reader, namespace string, vc *v1beta1.VaultConnection, identity string) *tokenStore {
	return &tokenStore{
		writer: writer, reader: reader, conn: vc.Name, identity: identity,
		key: types.NamespacedName{Namespace: namespace, Name: TokenSecretName(vc.Name, identity)},
		owner: metav1.OwnerReference{APIVersion: v1beta1.GroupVersion.String(), Kind: "VaultConnection",
			Name: vc.Name, UID: vc.UID},
	}
}

// Load returns the stored tokens, accessor to token, with those still kept under the store's name
// of an earlier keyroll, which it moves to the current one (migrate).
func (s *tokenStore) Load(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	sec, err := s.read(ctx)
	switch {
	case err == nil:
		for a, t := range sec.Data {
			out[a] = string(t)
		}
	case !apierrors.IsNotFound(err):
		return nil, err
	}
	moved, err := s.migrate(ctx)
	if err != nil {
		return nil, err
	}
	maps.Copy(out, moved)
	return out, nil
}

// Save adds and removes tokens with a merge patch of the Secret's data, key by key, so that two
// writers (a leader and its successor, for a moment) never drop each other's tokens. It creates
// the Secret on first use, and writes into one it finds only once it has checked that it is the
// store's own.
func (s *tokenStore) Save(ctx context.Context, put map[string]string, drop []string) error {
	sec, err := s.read(ctx)
	if apierrors.IsNotFound(err) {
		if len(put) == 0 {
			return nil // nothing to drop
		}
		if err = s.create(ctx, put); !apierrors.IsAlreadyExists(err) {
			if err != nil {
				return fmt.Errorf("creating Secret %s: %w", s.key, err)
			}
			return nil
		}
		sec, err = s.read(ctx) // created meanwhile: checked before it is written into
	}
	if err != nil {
		return err
	}
	return s.patch(ctx, sec, put, drop)
}

// read returns the Secret at the store's name once it has checked that it is the store's own; a
// NotFound error when there is none.
func (s *tokenStore) read(ctx context.Context) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	if err := s.reader.Get(ctx, s.key, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, err
		}
		return nil, fmt.Errorf("reading Secret %s: %w", s.key, err)
	}
	if why := s.foreign(sec); why != "" {
		return nil, s.refusal(sec, why)
	}
	return sec, nil
}

// foreign says why sec is not this store's Secret, or "" when it is: this VaultConnection owns it
// (by UID) and its annotations name the connection and the namespace, as create writes them.
func (s *tokenStore) foreign(sec *corev1.Secret) string {
	if !ownedBy(sec, s.owner.UID) {
		return "VaultConnection " + strconv.Quote(s.conn) + " (uid " + string(s.owner.UID) + ") does not own it"
	}
	if sec.Annotations[v1beta1.LabelVaultConnection] != s.conn {
		return "its annotation " + v1beta1.LabelVaultConnection + " does not name " + strconv.Quote(s.conn)
	}
	if ns, ok := sec.Annotations[v1beta1.AnnotationVaultNamespaceIdentity]; !ok || ns != s.identity {
		return "its annotation " + v1beta1.AnnotationVaultNamespaceIdentity + " is not " + strconv.Quote(s.identity)
	}
	return ""
}

// refusal is the error of a Secret that is not the store's: it names the Secret and why, and
// holds nothing of the Secret's data.
func (s *tokenStore) refusal(sec *corev1.Secret, why string) error {
	whose := "VaultConnection " + strconv.Quote(s.conn)
	if s.identity != "" {
		whose += " for namespace " + strconv.Quote(s.identity)
	}
	return fmt.Errorf("refusing Secret %s/%s: it is not the Vault token store of %s (%s); keyroll neither uses nor changes it, and keeps no tokens until it is moved away",
		sec.Namespace, sec.Name, whose, why)
}

func ownedBy(sec *corev1.Secret, uid types.UID) bool {
	for _, ref := range sec.OwnerReferences {
		if ref.UID == uid && ref.Kind == "VaultConnection" {
			return true
		}
	}
	return false
}

// patch merges put and drop into the data of sec, a Secret checked to be the store's. The patch
// carries sec's uid, which is immutable: should the Secret have been replaced since it was
// checked, the API server refuses the patch rather than writing into the new one.
func (s *tokenStore) patch(ctx context.Context, sec *corev1.Secret, put map[string]string, drop []string) error {
	data := make(map[string]any, len(put)+len(drop))
	for _, a := range drop {
		data[a] = nil
	}
	for a, t := range put {
		data[a] = base64.StdEncoding.EncodeToString([]byte(t))
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": sec.UID}, "data": data})
	if err != nil {
		return err
	}
	target := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sec.Namespace, Name: sec.Name}}
	if err := s.writer.Patch(ctx, target, client.RawPatch(types.MergePatchType, body)); err != nil {
		if apierrors.IsNotFound(err) && len(put) == 0 {
			return nil // gone: nothing left to drop
		}
		return fmt.Errorf("writing Secret %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	return nil
}

func (s *tokenStore) create(ctx context.Context, put map[string]string) error {
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.key.Namespace, Name: s.key.Name,
			Labels: map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue},
			Annotations: map[string]string{
				v1beta1.LabelVaultConnection:             s.conn,
				v1beta1.AnnotationVaultNamespaceIdentity: s.identity,
			},
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
