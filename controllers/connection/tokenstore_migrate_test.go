package connection

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// An upgrade moves the tokens of a store's old Secret (keyroll-tokens-<connection>[.<namespace>])
// to its new one, and empties the old one; a connection whose name reads like another's pair
// leaves that pair's old Secret alone; tokens written to the old Secret later move on a later Load.
func TestTokenStoreMovesTokensFromItsOldSecret(t *testing.T) {
	ctx := context.Background()
	vault, dotted := storeConnection("vault", "uid-vault"), storeConnection("vault.team-a", "uid-other")
	old := map[string]string{v1beta1.LabelVaultConnection: "vault"} // an earlier keyroll named no namespace
	c := fakeSecrets(t,
		tokenSecret("keyroll-tokens-vault", vault, old, map[string]string{"acc-own": "s.own"}),
		tokenSecret("keyroll-tokens-vault.team-a", vault, old, map[string]string{"acc-a": "s.team-a"}))

	if got, err := newTokenStore(c, c, tokenNS, dotted, "").Load(ctx); err != nil || len(got) != 0 {
		t.Errorf("vault.team-a loads %v, %v; want nothing of vault's team-a", got, err)
	}
	if d := secretData(t, c, "keyroll-tokens-vault.team-a"); d["acc-a"] != "s.team-a" {
		t.Fatalf("vault.team-a changed team-a's old Secret: %v", d)
	}
	for _, tc := range []struct{ identity, oldName, accessor, token string }{
		{"", "keyroll-tokens-vault", "acc-own", "s.own"},
		{"team-a", "keyroll-tokens-vault.team-a", "acc-a", "s.team-a"},
	} {
		s := newTokenStore(c, c, tokenNS, vault, tc.identity)
		if got, err := s.Load(ctx); err != nil || len(got) != 1 || got[tc.accessor] != tc.token {
			t.Errorf("%q: Load = %v, %v; want %s", tc.identity, got, err, tc.accessor)
		}
		if d := secretData(t, c, s.key.Name); len(d) != 1 || d[tc.accessor] != tc.token {
			t.Errorf("%q: new Secret holds %v", tc.identity, d)
		}
		if d := secretData(t, c, tc.oldName); d == nil || len(d) != 0 {
			t.Errorf("%q: old Secret holds %v, want it there and empty", tc.identity, d)
		}
	}

	// An earlier leader, still running, writes to the old Secret during the upgrade.
	s := newTokenStore(c, c, tokenNS, vault, "team-a")
	oldSec := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: tokenNS, Name: "keyroll-tokens-vault.team-a"}, oldSec); err != nil {
		t.Fatal(err)
	}
	if err := s.patch(ctx, oldSec, map[string]string{"acc-late": "s.late"}, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load(ctx); err != nil || len(got) != 2 || got["acc-late"] != "s.late" || got["acc-a"] != "s.team-a" {
		t.Errorf("Load = %v, %v; want acc-a and acc-late", got, err)
	}
	if d := secretData(t, c, "keyroll-tokens-vault.team-a"); len(d) != 0 {
		t.Errorf("old Secret holds %v after the second move", d)
	}
}

// An old Secret of 253 characters may be another namespace's name shortened: keyroll takes it
// only once it carries the namespace annotation, and leaves it alone when that names another.
func TestTokenStoreMovesAnAmbiguousOldSecretOnlyOnceAnnotated(t *testing.T) {
	ctx := context.Background()
	conn := strings.Repeat("v", 240)
	vc := storeConnection(conn, "uid-long")
	oldName := legacyTokenSecretName(conn, "team-a")
	if len(oldName) != 253 {
		t.Fatalf("old name of %d characters, want a shortened one", len(oldName))
	}
	for _, tc := range []struct {
		name       string
		annotation *string
		wantErr    bool
		want       int
	}{
		{"no namespace annotation", nil, true, 0},
		{"another namespace's", ptr.To("team-b"), false, 0},
		{"the connection's own", ptr.To(""), false, 0},
		{"annotated as team-a's", ptr.To("team-a"), false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{v1beta1.LabelVaultConnection: conn}
			if tc.annotation != nil {
				ann[v1beta1.AnnotationVaultNamespaceIdentity] = *tc.annotation
			}
			c := fakeSecrets(t, tokenSecret(oldName, vc, ann, map[string]string{"acc-a": "s.team-a"}))
			s := newTokenStore(c, c, tokenNS, vc, "team-a")
			got, err := s.Load(ctx)
			if (err != nil) != tc.wantErr || len(got) != tc.want {
				t.Fatalf("Load = %v, %v", got, err)
			}
			if err != nil && (!strings.Contains(err.Error(), v1beta1.AnnotationVaultNamespaceIdentity) || strings.Contains(err.Error(), "s.team-a")) {
				t.Errorf("error %q: want the annotation to set and no token", err)
			}
			if left := len(secretData(t, c, oldName)); left != 1-tc.want {
				t.Errorf("old Secret holds %d tokens, want %d", left, 1-tc.want)
			}
		})
	}
}
