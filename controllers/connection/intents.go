package connection

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// Intents records, before keyroll asks Vault for a credential, that it is about to: the path, the
// time and the cluster, in a ConfigMap of this install's own namespace (intentsName, labelled as
// keyroll's), and drops the record once the lease is in the ledger or the issue failed.
// A record that stays names an issue whose lease may never have reached a ledger (the operator was
// killed in between): the orphan-lease sweep revokes a lease it cannot place only when it matches
// such a record, so that it never revokes a lease that another install, Vault Agent or a person
// obtained on the same role. Another install keeps its records in its own namespace.
type Intents struct {
	Writer client.Client
	// Reader reads past the cache.
	Reader    client.Reader
	Namespace string
	Clock     clock.Clock
}

// Intent is one record: keyroll was about to issue a credential from Path for Cluster at At.
type Intent struct {
	ID      string    `json:"-"`
	Path    string    `json:"path"`
	Cluster string    `json:"cluster"`
	At      time.Time `json:"at"`
}

const intentsPrefix = "keyroll-intents-"

// intentsName is the name of the ConfigMap holding a VaultConnection's intents, named as
// TokenSecretName names token Secrets: keyroll-intents-<connection>-<hash>, the readable part
// shortened to keep within 253 characters, the hash (128 bits of SHA-256) over the whole of it.
// Every name carries the hash, so that no two connections share one: when only the shortened
// names carried it, a connection named like another's shortened name (its first characters, a
// dash and 16 hexadecimal digits) had the other's ConfigMap, and its sweep the other's records.
func intentsName(connection string) string {
	sum := sha256.Sum256([]byte(connection))
	hash := hex.EncodeToString(sum[:16])
	readable := connection
	if room := 253 - len(intentsPrefix) - len("-") - len(hash); len(readable) > room {
		// A label of a DNS subdomain neither starts nor ends with '-', nor is it empty.
		readable = strings.TrimRight(readable[:room], ".-")
	}
	return intentsPrefix + readable + "-" + hash
}

// legacyIntentsName is the name an earlier keyroll gave the ConfigMap of connection's intents.
// Open reads the records left there too, and Drop drops them there, until none is left (the
// sweep drops each once it is older than any lease it could match); keyroll may not delete the
// emptied ConfigMap, which an administrator may.
func legacyIntentsName(connection string) string {
	name := intentsPrefix + connection
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(connection))
	return name[:253-17] + "-" + hex.EncodeToString(sum[:8])
}

// legacyID marks the ID of a record Open found under legacyIntentsName. A ConfigMap's keys hold
// no ':', so that no record's own ID starts with it.
const legacyID = "legacy:"

// Record writes an intent to issue from path for cluster, and returns its ID.
func (s *Intents) Record(ctx context.Context, connection, path string, cluster types.NamespacedName) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	in := Intent{Path: path, Cluster: cluster.String(), At: s.Clock.Now().UTC()}
	id := fmt.Sprintf("%d-%s", in.At.UnixNano(), hex.EncodeToString(b[:]))
	v, err := json.Marshal(in)
	if err != nil {
		return "", err
	}
	return id, s.patch(ctx, intentsName(connection), connection, map[string]any{id: string(v)}, true)
}

// Drop removes intents, each from the ConfigMap Open found it in.
func (s *Intents) Drop(ctx context.Context, connection string, ids ...string) error {
	data, legacy := map[string]any{}, map[string]any{}
	for _, id := range ids {
		if old, ok := strings.CutPrefix(id, legacyID); ok {
			legacy[old] = nil
		} else {
			data[id] = nil
		}
	}
	if len(legacy) > 0 {
		if err := s.patch(ctx, legacyIntentsName(connection), connection, legacy, false); err != nil {
			return err
		}
	}
	if len(data) == 0 {
		return nil
	}
	return s.patch(ctx, intentsName(connection), connection, data, false)
}

// Open lists the intents recorded for connection, with those an earlier keyroll recorded under
// legacyIntentsName. Those are taken only from a ConfigMap labelled as keyroll's whose
// annotation names connection: under that name, another connection's ConfigMap could be there.
func (s *Intents) Open(ctx context.Context, connection string) ([]Intent, error) {
	out, err := s.open(ctx, intentsName(connection), "", nil)
	if err != nil {
		return nil, err
	}
	if old := legacyIntentsName(connection); old != intentsName(connection) {
		ours := func(cm *corev1.ConfigMap) bool {
			return cm.Labels[v1beta1.LabelManagedBy] == v1beta1.ManagedByValue && cm.Annotations[v1beta1.LabelVaultConnection] == connection
		}
		legacy, err := s.open(ctx, old, legacyID, ours)
		if err != nil {
			return nil, err
		}
		out = append(out, legacy...)
	}
	return out, nil
}

// open reads the intents of ConfigMap name, their IDs prefixed with prefix; none unless the
// ConfigMap exists and, with ours, passes it.
func (s *Intents) open(ctx context.Context, name, prefix string, ours func(*corev1.ConfigMap) bool) ([]Intent, error) {
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: s.Namespace, Name: name}
	if err := s.Reader.Get(ctx, key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading ConfigMap %s: %w", key, err)
	}
	if ours != nil && !ours(cm) {
		return nil, nil
	}
	out := make([]Intent, 0, len(cm.Data))
	for id, v := range cm.Data {
		var in Intent
		if json.Unmarshal([]byte(v), &in) != nil {
			continue // not one of ours: never matches
		}
		in.ID = prefix + id
		out = append(out, in)
	}
	return out, nil
}

// patch merges data into ConfigMap name of connection key by key (so that concurrent writers
// keep each other's keys), creating it when create is set.
func (s *Intents) patch(ctx context.Context, name, connection string, data map[string]any, create bool) error {
	key := types.NamespacedName{Namespace: s.Namespace, Name: name}
	body, err := json.Marshal(map[string]any{"data": data})
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	err = s.Writer.Patch(ctx, cm, client.RawPatch(types.MergePatchType, body))
	if apierrors.IsNotFound(err) && create {
		cm.Labels = map[string]string{v1beta1.LabelManagedBy: v1beta1.ManagedByValue}
		cm.Annotations = map[string]string{v1beta1.LabelVaultConnection: connection}
		cm.Data = map[string]string{}
		for k, v := range data {
			cm.Data[k], _ = v.(string)
		}
		err = s.Writer.Create(ctx, cm)
		if apierrors.IsAlreadyExists(err) {
			err = s.Writer.Patch(ctx, cm, client.RawPatch(types.MergePatchType, body))
		}
	}
	if apierrors.IsNotFound(err) {
		return nil // nothing to drop
	}
	if err != nil {
		return fmt.Errorf("writing ConfigMap %s: %w", key, err)
	}
	return nil
}
