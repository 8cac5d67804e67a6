package connection

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
// time and the cluster, in a ConfigMap of this install's own namespace (keyroll-intents-<connection>,
// labelled as keyroll's), and drops the record once the lease is in the ledger or the issue failed.
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

// intentsName is the name of the ConfigMap holding a VaultConnection's intents.
func intentsName(connection string) string {
	name := "keyroll-intents-" + connection
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(connection))
	return name[:253-17] + "-" + hex.EncodeToString(sum[:8])
}

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
	return id, s.patch(ctx, connection, map[string]any{id: string(v)}, true)
}

// Drop removes intents.
func (s *Intents) Drop(ctx context.Context, connection string, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	data := make(map[string]any, len(ids))
	for _, id := range ids {
		data[id] = nil
	}
	return s.patch(ctx, connection, data, false)
}

// Open lists the intents recorded for connection.
func (s *Intents) Open(ctx context.Context, connection string) ([]Intent, error) {
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: s.Namespace, Name: intentsName(connection)}
	if err := s.Reader.Get(ctx, key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading ConfigMap %s: %w", key, err)
	}
	out := make([]Intent, 0, len(cm.Data))
	for id, v := range cm.Data {
		var in Intent
		if json.Unmarshal([]byte(v), &in) != nil {
			continue // not one of ours: never matches
		}
		in.ID = id
		out = append(out, in)
	}
	return out, nil
}

// patch merges data into the ConfigMap key by key (so that concurrent writers keep each other's
// keys), creating it when create is set.
func (s *Intents) patch(ctx context.Context, connection string, data map[string]any, create bool) error {
	key := types.NamespacedName{Namespace: s.Namespace, Name: intentsName(connection)}
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
