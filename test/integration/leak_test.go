package integration

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/framework"
)

// A whole issue-rotate-delete scenario on two Redis nodes, with the operator logging at debug
// level: no password (the issued credentials' and those of keyroll's own users on the nodes:
// admin, replication, probe), Vault token or service-account token from the run appears in any
// log line, event or status.
func TestNoSecretReachesLogsEventsOrStatus(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "leak")
	// Token auth, so that the operator's Vault token is known to the test.
	tok, err := fw.Ground.Vault.Root.Auth().Token().Create(&vaultapi.TokenCreateRequest{Policies: []string{fw.OperatorRole}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	token := tok.Auth.ClientToken
	fw.Create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: fw.OperatorNS, Name: "vault-token-leak"},
		Data: map[string][]byte{"token": []byte(token)}})
	vc := fw.VaultConnection(t, "vault-leak", framework.Allow(ns), func(vc *v1beta1.VaultConnection) {
		vc.Spec.Auth = v1beta1.VaultAuth{Token: &v1beta1.TokenAuth{SecretRef: v1beta1.SecretKeyReference{
			Namespace: fw.OperatorNS, Name: "vault-token-leak", Key: "token"}}}
	})
	rc := fw.RedisCluster(t, ns, "orders", vc.Name, fw.Path("orders"), framework.Replicas(2))

	var statuses []string
	snapshot := func() {
		b, _ := json.Marshal(fw.Get(t, rc).Status)
		statuses = append(statuses, string(b))
		v := &v1beta1.VaultConnection{}
		if err := fw.Client.Get(ctx, client.ObjectKey{Name: vc.Name}, v); err == nil {
			b, _ = json.Marshal(v.Status)
			statuses = append(statuses, string(b))
		}
	}
	fw.WaitReady(t, rc, 90*time.Second)
	snapshot()
	user1, pass1, _ := fw.Credentials(rc)
	// The scenario changes users on the nodes: the first credential is on both.
	if msg := fw.OnEveryPod(rc, user1, pass1, true); msg != "" {
		t.Fatal(msg)
	}
	internal := fw.InternalPasswords(t, rc)
	ack := fw.RotateNow(t, rc)
	framework.Eventually(t, 60*time.Second, func() string {
		cur := fw.Get(t, rc)
		if cur.Status.RotateNowAcknowledged != ack || cur.Status.Rollout != nil || len(cur.Status.Leases) != 1 {
			return "rotation not finished"
		}
		return ""
	})
	snapshot()
	user2, pass2, _ := fw.Credentials(rc)
	if msg := fw.OnEveryPod(rc, user2, pass2, true); msg != "" {
		t.Fatal(msg)
	}
	fw.DeleteAndWait(t, rc, 30*time.Second)

	events := &eventsv1.EventList{}
	if err := fw.Client.List(ctx, events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(events.Items)
	places := map[string]string{"logs": fw.Logs.String(), "events": string(b), "status": strings.Join(statuses, "\n")}
	if len(events.Items) < 5 || !strings.Contains(places["logs"], "Credential issued") || !strings.Contains(places["logs"], "Redis node confirmed") {
		t.Fatalf("the scenario left too little to check: %d events", len(events.Items))
	}
	secrets := map[string]string{"first password": pass1, "second password": pass2, "operator's Vault token": token,
		"Vault root token": fw.Ground.Vault.RootToken}
	for k, v := range internal {
		secrets[k] = v
	}
	patterns := map[string]*regexp.Regexp{
		"a Vault token":    regexp.MustCompile(`hv[sbr]\.[A-Za-z0-9_-]{20,}`),
		"a JSON Web Token": regexp.MustCompile(`eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}`),
	}
	for where, text := range places {
		for what, s := range secrets {
			if s != "" && strings.Contains(text, s) {
				t.Errorf("the %s appears in the %s", what, where)
			}
		}
		for what, re := range patterns {
			if m := re.FindString(text); m != "" {
				t.Errorf("something shaped like %s appears in the %s", what, where)
			}
		}
	}
}
