package scale

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/externalsecrets"
	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/render"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// esoScaleFlags are External Secrets Operator's flags for scale: more reconcile workers, as its
// maintainers advise for slow syncs of many ExternalSecrets (issue #3258; the chart's value
// `concurrent`, default 1). Its client QPS and burst (--client-qps, --client-burst) are left at
// v0.20.4's defaults, 50 and 100, which ESO raised from client-go's 5 and 10 for this very problem
// (PR #4202); its docs recommend no other value. --experimental-enable-vault-token-cache would
// not apply: the VaultDynamicSecret generator builds its Vault client without the cache, and logs
// in for every Secret whatever the flags.
var esoScaleFlags = []string{"--concurrent=10"}

// The Vault role both controllers issue from, and what ESO may do with it.
const (
	credPath   = "database/creds/scale"
	esoPolicy  = `path "database/creds/scale" { capabilities = ["read"] }`
	esoRole    = "eso-scale"
	esoAccount = "external-secrets"
	generator  = "redis-scale"
)

// BenchmarkSideBySide delivers N dynamic Redis credentials from one Vault role (database/creds/scale)
// as Secrets, three times, each on a fresh test ground: keyroll with N RedisClusters, External
// Secrets Operator v0.20.4 at its default flags and at esoScaleFlags with N ExternalSecrets. It
// reports the time until all Secrets exist (and keyroll's until all are CredentialsReady), Vault's
// issues, logins and requests counted in its audit log, the controller's API writes, peak RSS
// and CPU time, and keyroll/ESO ratios.
func BenchmarkSideBySide(b *testing.B) {
	var results []sideResult
	defer func() {
		if len(results) > 0 {
			fmt.Print(sideBySideTable(results))
			writeSection(b, "side-table", sideBySideTable(results))
		}
		if err := writeSidePlot(os.Getenv("KEYROLL_PERFORMANCE_PLOT"), results); err != nil {
			b.Error(err)
		}
	}()
	for _, n := range sizes("KEYROLL_SIDE_SIZES") {
		b.Run(fmt.Sprintf("credentials=%d", n), func(b *testing.B) {
			b.StopTimer()
			for range b.N {
				res := sideResult{n: n, keyroll: sideKeyroll(b, n)}
				res.eso = sideESO(b, n, "eso-default", nil)
				res.esoScaled = sideESO(b, n, "eso-concurrent-10", esoScaleFlags)
				res.report(b)
				results = append(results, res)
			}
		})
	}
}

// sideKeyroll creates N RedisClusters (createAll) and times them until all are CredentialsReady,
// and until all hold their credential in a Secret.
//
// Which Secret: the consumers' Secret (<name>-credentials) is written only once every Redis node
// accepts the new user, and kwok's pods run no Redis, so it never appears here. Nor does the ACL
// Secret (<name>-acl) get the user on kwok: reconcileUsers checks spec.credentials.aclRules on a
// running Redis node (nodes.CheckRules) before it writes the aclfile with an app user (aclUsers
// counts those that did). The Secret timed is the state Secret (<name>-keyroll, keys username and
// password), where keyroll stages the credential right after its issue and ledger write, before
// any node or consumer has it: a credential delivered as a Secret, but one only keyroll reads.
// With real nodes, the consumers' Secret follows after the live ACL change on each node.
func sideKeyroll(b *testing.B, n int) variant {
	b.Helper()
	r := startRun(b, fmt.Sprintf("side-keyroll-%d", n), runOptions{ground: testground.Options{ExternalSecretsCRDs: true}})
	defer r.end()
	audit, err := r.fw.EnableAudit(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	staged := map[string]bool{}
	for i := range n {
		staged[render.StateSecretName(cluster(i))] = true
	}
	w := watchSecrets(b, r, func(s *corev1.Secret) bool { return staged[s.Name] && len(s.Data[render.StateUsernameKey]) > 0 })
	ready := watchReady(b, r)
	writes0 := r.metric(b, writesOf)
	b.StartTimer()
	start := time.Now()
	createAll(b, r.c, r.ns, "c", n, r.ns)
	v := variant{name: "keyroll", ready: ready.wait(b, start, n, 15*time.Minute, func() string { return exited(r.p.Done()) })}
	v.secrets = w.wait(b, start, n, 5*time.Minute, func() string { return exited(r.p.Done()) })
	b.StopTimer()
	v.writes = r.metric(b, writesOf) - writes0
	u, err := r.p.Usage()
	if err != nil {
		b.Fatal(err)
	}
	v.usage, v.vault, v.aclUsers = u, countVault(b, audit), aclUsers(b, r, n)
	return v
}

// sideESO creates N ExternalSecrets that all take their credential from one VaultDynamicSecret
// generator, and times them until all N target Secrets hold a username and password. One shared
// generator is the same work as keyroll's: N RedisClusters share one VaultConnection (the Vault
// address and auth), and each still makes its own Vault read; ESO calls the generator once per
// ExternalSecret either way. The ground is a fresh one like keyroll's (kube-controller-manager and
// kwok idle), with keyroll's operator stopped before ESO starts, so ESO works alone.
func sideESO(b *testing.B, n int, name string, flags []string) variant {
	b.Helper()
	r := startRun(b, fmt.Sprintf("side-%s-%d", name, n), runOptions{ground: testground.Options{ExternalSecretsCRDs: true}})
	defer r.end()
	r.p.Kill()
	esoSetup(b, r)
	p, metricsURL := startESO(b, r, name, flags)
	dead := func() string {
		if p.Exited() {
			return "ESO exited; its log:\n" + p.Tail()
		}
		return ""
	}
	// One ExternalSecret synced before the clock starts: ESO is up, its caches are synced, and
	// the generator, the auth and the role work (keyroll's VaultConnection is Ready likewise).
	warm := watchSecrets(b, r, func(s *corev1.Secret) bool { return s.Name == "warmup-credentials" && len(s.Data["username"]) > 0 })
	createParallel(b, 1, func(int) error { return createExternalSecret(r, "warmup") })
	warm.wait(b, time.Now(), 1, 2*time.Minute, dead)
	audit, err := r.fw.EnableAudit(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	targets := map[string]bool{}
	for i := range n {
		targets[render.CredentialsSecretName(cluster(i))] = true
	}
	w := watchSecrets(b, r, func(s *corev1.Secret) bool {
		return targets[s.Name] && len(s.Data["username"]) > 0 && len(s.Data["password"]) > 0
	})
	writes0 := scrape(b, metricsURL, writesOf)
	b.StartTimer()
	start := time.Now()
	createParallel(b, n, func(i int) error { return createExternalSecret(r, cluster(i).Name) })
	v := variant{name: name, secrets: w.wait(b, start, n, 15*time.Minute, dead)}
	b.StopTimer()
	v.writes = scrape(b, metricsURL, writesOf) - writes0
	if v.usage, err = framework.UsageOf(p.PID()); err != nil {
		b.Fatal(err)
	}
	v.vault = countVault(b, audit)
	return v
}

// cluster is the i-th RedisCluster of createAll with prefix "c"; ESO's ExternalSecrets take the
// same names, and their target Secrets the consumers' Secrets' names.
func cluster(i int) *v1beta1.RedisCluster {
	return &v1beta1.RedisCluster{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%04d", i)}}
}

// esoSetup gives ESO what framework's ESOKubernetesAuth gives it: Kubernetes auth as the
// service account external-secrets of the run's namespace (Vault role eso-scale, reading the
// role "scale" only), and the generator for database/creds/scale.
func esoSetup(b *testing.B, r *run) {
	b.Helper()
	ctx := context.Background()
	if err := r.fw.Ground.Vault.WritePolicy(ctx, "eso", esoPolicy); err != nil {
		b.Fatal(err)
	}
	if err := r.fw.Ground.CP.EnsureServiceAccount(ctx, r.ns, esoAccount); err != nil {
		b.Fatal(err)
	}
	err := r.fw.Ground.Vault.WriteKubernetesAuthRole(ctx, testground.KubernetesAuthRole{Name: esoRole,
		ServiceAccounts: []string{esoAccount}, Namespaces: []string{r.ns}, Policies: []string{"eso"}, TokenTTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	gen := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "generators.external-secrets.io/v1alpha1", "kind": "VaultDynamicSecret",
		"metadata": map[string]any{"name": generator, "namespace": r.ns},
		"spec": map[string]any{"path": credPath, "method": "GET", "provider": map[string]any{
			"server": r.fw.Ground.Vault.Addr,
			"auth": map[string]any{"kubernetes": map[string]any{"mountPath": "kubernetes", "role": esoRole,
				"serviceAccountRef": map[string]any{"name": esoAccount, "audiences": []any{"vault"}}}},
		}},
	}}
	if err := r.c.Create(ctx, gen); err != nil {
		b.Fatal(err)
	}
}

// createExternalSecret creates the ExternalSecret name, whose target is <name>-credentials.
func createExternalSecret(r *run, name string) error {
	return r.c.Create(context.Background(), &externalsecrets.ExternalSecret{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: name},
		Spec: externalsecrets.ExternalSecretSpec{
			RefreshInterval: &metav1.Duration{Duration: time.Hour},
			Target:          externalsecrets.Target{Name: name + "-credentials"},
			DataFrom: []externalsecrets.DataFrom{{SourceRef: &externalsecrets.SourceRef{
				GeneratorRef: &externalsecrets.GeneratorRef{APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: generator},
			}}},
		},
	})
}

// startESO runs External Secrets Operator's controller as its own process with flags, as
// testground.StartExternalSecrets does (which takes no flags), but with its metrics on a free
// port. It returns the process and its metrics URL.
func startESO(b *testing.B, r *run, name string, flags []string) (*testground.Process, string) {
	b.Helper()
	bin, err := testground.Binary("external-secrets")
	if err != nil {
		b.Fatal(err)
	}
	port, err := testground.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	args := append([]string{fmt.Sprintf("--metrics-addr=127.0.0.1:%d", port), "--live-addr=0", "--enable-leader-election=false"}, flags...)
	p, err := testground.StartProcess(r.fw.Ground.Dir, name, bin, args, []string{"KUBECONFIG=" + r.fw.Ground.CP.Kubeconfig, "HOME=" + r.fw.Ground.Dir})
	if err != nil {
		b.Fatal(err)
	}
	r.stop = append(r.stop, p.Stop)
	fmt.Fprintf(os.Stderr, "scale: %s %v, ESO's log: %s\n", name, flags, p.LogPath)
	return p, fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
}

// watchSecrets watches the run's Secrets for those that satisfy want.
func watchSecrets(b *testing.B, r *run, want func(*corev1.Secret) bool) *seenWatch {
	return watchSeen(b, r, &corev1.Secret{}, func(o client.Object) bool { return want(o.(*corev1.Secret)) })
}

// exited says that the operator exited, once done is closed.
func exited(done <-chan struct{}) string {
	select {
	case <-done:
		return "the operator exited"
	default:
		return ""
	}
}

// aclUsers counts the clusters whose ACL Secret's aclfile holds the user of their state Secret.
func aclUsers(b *testing.B, r *run, n int) int {
	b.Helper()
	list := &corev1.SecretList{}
	if err := r.c.List(context.Background(), list, client.InNamespace(r.ns)); err != nil {
		b.Fatal(err)
	}
	byName := map[string]*corev1.Secret{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	k := 0
	for i := range n {
		st, acl := byName[render.StateSecretName(cluster(i))], byName[render.ACLSecretName(cluster(i))]
		if st != nil && acl != nil && strings.Contains(string(acl.Data[render.ACLFileKey]), "user "+string(st.Data[render.StateUsernameKey])+" on ") {
			k++
		}
	}
	return k
}
