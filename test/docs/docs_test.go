// Package docs checks that every command in keyroll's docs is run by a test, and runs the ones for
// installing keyroll and setting up Vault against a real kube-apiserver with the test ground's real
// node (where the Redis pods run) and kwok's fake node (where the installed manager's pod goes: the
// real node does not have its image), a Vault dev server and redis-server, with the operator
// running.
package docs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/controllers/connection"
	"github.com/keyroll/keyroll/test/docblocks"
	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

var root = testground.RepoRoot()

// Every shell block of the docs carries a tag that names the test that runs it, and no block
// holds commands without one.
func TestEveryShellBlockIsRunByATest(t *testing.T) {
	blocks, untagged, err := docblocks.Extract(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range untagged {
		t.Errorf("%s: a code block without a language and a tag (use \"sh TAG\" with a tag of docblocks.Tags, or a non-shell language)", u)
	}
	count := map[string]int{}
	for _, b := range blocks {
		if _, ok := docblocks.Tags[b.Tag]; !ok {
			t.Errorf("%s: unknown tag %q", b, b.Tag)
		}
		count[b.Tag]++
	}
	for tag, runner := range docblocks.Tags {
		t.Logf("%-12s %2d block(s), run by %s", tag, count[tag], runner)
	}
	if count["needs-docker"] > 1 {
		t.Errorf("%d blocks need Docker; only the image build may", count["needs-docker"])
	}
}

// The README's two commands are the ones CI and the playground test run.
func TestTheTwoCommandsAreWhatCIAndThePlaygroundTestRun(t *testing.T) {
	blocks := docblocks.Tagged(t, root, "two-commands")
	if len(blocks) != 1 || blocks[0].File != "README.md" {
		t.Fatalf("want one two-commands block, in README.md: %v", blocks)
	}
	var cmds []string
	for _, line := range strings.Split(strings.TrimSpace(blocks[0].Text), "\n") {
		cmds = append(cmds, strings.TrimSpace(strings.SplitN(line, "#", 2)[0]))
	}
	if !slices.Equal(cmds, []string{"make playground", "make test"}) {
		t.Fatalf("the two commands are %q, want make playground and make test", cmds)
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^make test$`).Match(ci) {
		t.Errorf(".ci/run does not run exactly %q:\n%s", "make test", ci)
	}
	pg, err := os.ReadFile(filepath.Join(root, "test", "playground", "playground_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	// As is, or through a shell that pipes its output (as a newcomer keeping a log would).
	if !regexp.MustCompile(`exec\.Command\(("make", "playground"|"bash", "-c", fmt\.Sprintf\("make playground )`).Match(pg) {
		t.Error("the playground test does not run make playground")
	}
}

// The development commands of the README.
func TestDevelopmentCommands(t *testing.T) {
	for _, b := range docblocks.Tagged(t, root, "dev") {
		// make layout builds and runs a test of controllers/: minutes on a busy two-core machine.
		out := docblocks.Run(t, b, root, nil, 5*time.Minute)
		if strings.Contains(b.Text, "make layout") {
			for _, p := range []string{"controllers/rediscluster", "controllers/credential", "controllers/connection"} {
				if !strings.Contains(out, "| `"+p+"` | Package ") {
					t.Errorf("%s: the layout does not show %s with what it is for:\n%s", b, p, out)
				}
			}
			continue
		}
		if !strings.Contains(b.Text, "make help") {
			if !strings.Contains(out, "controllers/rediscluster:") {
				t.Errorf("%s: the import listing does not show controllers/rediscluster:\n%s", b, out)
			}
			continue
		}
		for _, target := range []string{"playground", "test", "unit", "lint", "manifests", "generate", "bench", "deploy"} {
			if !regexp.MustCompile(`(?m)^\s+` + target + `\s`).MatchString(out) {
				t.Errorf("make help does not list %s:\n%s", target, out)
			}
		}
	}
}

// The README's install commands and the Vault administrators' guide, in order, as written: then
// the operator (running in this test, as the installed service account) logs in to Vault, and a
// RedisCluster becomes Ready with a working credential through the role, the policy and the
// Kubernetes auth role that the guide set up: on the Redis Vault manages users on, and on the
// RedisCluster's own pod, with the role's rules.
func TestInstallAndVaultAdministratorCommands(t *testing.T) {
	g := testground.StartT(t, testground.Options{Node: true, Workloads: true, Redis: true, Vault: true})
	// The docs fix every name (keyroll-system, the role keyroll, default, orders): nothing is prefixed.
	f := framework.New(framework.Config{})
	if err := f.Use(g); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	deadline, _ := ctx.Deadline()
	// The install's manager Deployment runs an image the real node does not have: its namespace,
	// made before the install applies it (apply keeps the label), sends its pods to kwok.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.OperatorNS, Labels: map[string]string{testground.NodeLabel: "kwok"}}}
	if err := f.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"KUBECONFIG=" + g.CP.Kubeconfig, "PATH=" + testground.BinDir() + ":" + os.Getenv("PATH"),
		"VAULT_ADDR=" + g.Vault.Addr, "VAULT_TOKEN=" + g.Vault.RootToken,
		"REDIS_HOST=127.0.0.1", "REDIS_PORT=" + strconv.Itoa(g.Redis.Port),
		"REDIS_ADMIN_USER=" + g.Redis.AdminUser, "REDIS_ADMIN_PASSWORD=" + g.Redis.AdminPassword,
	}
	for _, b := range docblocks.Tagged(t, root, "install") {
		docblocks.Run(t, b, root, env, 3*time.Minute)
	}
	d := &appsv1.Deployment{}
	if err := f.Client.Get(ctx, client.ObjectKey{Namespace: f.OperatorNS, Name: "keyroll-manager"}, d); err != nil {
		t.Fatalf("the install did not create the manager Deployment: %v", err)
	}

	// The operator as installed: its service account, with the permissions the install grants it
	// (deploy/rbac) and no more, logging in to Vault with TokenRequest tokens.
	op, err := f.NewOperator(ctx, framework.OperatorOptions{AsServiceAccount: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = op.Stop() }()
	for _, b := range docblocks.Tagged(t, root, "vault-setup") {
		docblocks.Run(t, b, root, env, 3*time.Minute)
	}

	rc := f.RedisCluster(t, "default", "orders", "vault", f.Path("orders"), func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials.ACLRules = []string{"~orders:*", "&*", "+@all"}
	})
	cur := f.WaitReady(t, rc, time.Until(deadline))
	user, lease := cur.Status.Credential.Username, cur.Status.Credential.Lease.LeaseID
	if !strings.HasPrefix(lease, f.Path("orders")+"/") {
		t.Errorf("lease %q is not of the orders role", lease)
	}
	_, pass, ok := f.Credentials(cur)
	if !ok {
		t.Fatal("no credentials Secret orders-credentials")
	}
	pod, err := f.Clientset.CoreV1().Pods("default").Get(ctx, "orders-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for where, addr := range map[string]string{"Vault's Redis": g.Redis.Addr(), "the Redis pod orders-0": framework.PodAddr(pod)} {
		if who, err := testground.RedisWhoAmI(addr, user, pass); err != nil || who != user {
			t.Fatalf("the credential issued through the guide's setup does not authenticate on %s: %q, %v", where, who, err)
		}
		if _, err := testground.RedisDo(addr, user, pass, "SET", "other:key", "x"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("the orders role's rules (~orders:*) are not enforced on %s: %v", where, err)
		}
	}
	checkTokenKept(t, ctx, f, cur.Status.Credential.VaultLease.TokenAccessor)
	_ = f.Client.Delete(ctx, rc)
	checkTenancy(t, ctx, f, env, time.Until(deadline))

	// This cluster has no External Secrets Operator: a RedisCluster in ExternalSecret mode says
	// so (docs/externalsecret-mode.md) instead of waiting silently.
	es := f.RedisCluster(t, "default", "payments", "", "", func(rc *v1beta1.RedisCluster) {
		rc.Spec.Credentials = v1beta1.CredentialsSpec{
			Source: v1beta1.SourceExternalSecret,
			ExternalSecret: &v1beta1.ExternalSecretSource{GeneratorRef: &v1beta1.GeneratorReference{
				APIVersion: "generators.external-secrets.io/v1alpha1", Kind: "VaultDynamicSecret", Name: "redis-payments"}},
		}
	})
	framework.Eventually(t, time.Until(deadline), func() string {
		c := framework.Condition(f.Get(t, es), v1beta1.ConditionCredentialsReady)
		if c == nil || c.Reason != v1beta1.ReasonExternalSecretsNotInstalled || !strings.Contains(c.Message, "install External Secrets Operator") {
			return fmt.Sprintf("an ExternalSecret-mode RedisCluster without ESO does not report %s: %+v", v1beta1.ReasonExternalSecretsNotInstalled, c)
		}
		return ""
	})
}

// checkTenancy runs the guide's tenancy commands: two teams' roles, and a VaultConnection that
// allows each namespace the roles named after it. A RedisCluster of team-a gets a working
// credential from its own role; one of team-a that names team-b's role is refused, and Vault's
// audit log holds no request of the operator for it.
func checkTenancy(t *testing.T, ctx context.Context, f *framework.Framework, env []string, timeout time.Duration) {
	t.Helper()
	auditLog, err := f.EnableAudit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range docblocks.Tagged(t, root, "vault-tenancy") {
		docblocks.Run(t, b, root, env, 3*time.Minute)
	}
	own := f.RedisCluster(t, "team-a", "orders", "vault-teams", "database/creds/team-a.orders")
	theirs := f.RedisCluster(t, "team-a", "stolen", "vault-teams", "database/creds/team-b.orders")
	f.WaitCondition(t, theirs, v1beta1.ConditionCredentialsReady, metav1.ConditionFalse, v1beta1.ReasonPathNotAllowed, timeout)
	cur := f.WaitReady(t, own, timeout)
	if user, pass, _ := f.Credentials(cur); !f.Authenticates(user, pass) {
		t.Error("team-a's credential from its own role does not authenticate")
	}
	entries, err := framework.ReadAudit(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.ByRole("keyroll") && strings.Contains(e.Request.Path, "team-b.orders") {
			t.Errorf("the operator asked Vault for team-b's role on team-a's behalf: %s %s", e.Request.Operation, e.Request.Path)
		}
	}

	// identity Namespace: team-b's credential through team-b's own login, with the permissions
	// the namespace granted keyroll (its RoleBinding) and no more.
	b := f.RedisCluster(t, "team-b", "orders", "vault-teams-own", "database/creds/team-b.orders")
	cur = f.WaitReady(t, b, timeout)
	if user, pass, _ := f.Credentials(cur); !f.Authenticates(user, pass) {
		t.Error("team-b's credential through its own login does not authenticate")
	}
	if entries, err = framework.ReadAudit(auditLog); err != nil {
		t.Fatal(err)
	}
	issued := 0
	for _, e := range entries {
		if e.Request.Path == "database/creds/team-b.orders" && e.Type == "request" {
			if !e.ByRole("keyroll-team-b") {
				t.Errorf("team-b's credential was asked for as %q, not as team-b's own role", e.Auth.Metadata["role"])
			}
			issued++
		}
	}
	if issued == 0 {
		t.Error("no issue of team-b's credential in the audit log")
	}
}

// checkTokenKept: the guide's role gives periodic tokens, which keyroll keeps in the
// VaultConnection's token Secret and lists in its status, with no end.
func checkTokenKept(t *testing.T, ctx context.Context, f *framework.Framework, accessor string) {
	t.Helper()
	sec := &corev1.Secret{}
	if err := f.Client.Get(ctx, client.ObjectKey{Namespace: f.OperatorNS, Name: connection.TokenSecretName("vault", "")}, sec); err != nil {
		t.Fatalf("the token Secret the guide describes: %v", err)
	}
	if _, ok := sec.Data[accessor]; !ok || accessor == "" {
		t.Errorf("the token that created the lease (accessor %q) is not in the token Secret (keys %d)", accessor, len(sec.Data))
	}
	for _, tok := range f.GetConnection(t, "vault").Status.Tokens {
		if tok.EndsAt != nil {
			t.Errorf("token %s of the guide's periodic role has an end (%s)", tok.Accessor, tok.EndsAt)
		}
	}
}

// TestREADMEFlagDefaultsAreTheBinarys: the defaults in the README's table of manager flags are
// those of the binary: its --help for every flag that shows one, and for --zap-encoder, which
// shows none, the encoding of the lines it logs by default.
func TestREADMEFlagDefaultsAreTheBinarys(t *testing.T) {
	bin, err := framework.BuildOperator(t.TempDir())
	if err != nil {
		t.Fatalf("building the manager: %v", err)
	}
	help, _ := exec.Command(bin, "--help").CombinedOutput()
	defaults := map[string]string{}
	lines := strings.Split(string(help), "\n")
	for i, l := range lines {
		if m := regexp.MustCompile(`^\s+-([a-z-]+)\b`).FindStringSubmatch(l); m != nil && i+1 < len(lines) {
			if d := regexp.MustCompile(`\(default "?([^")]*)"?\)`).FindStringSubmatch(lines[i+1]); d != nil {
				defaults[m[1]] = d[1]
			}
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile("(?m)^\\| `--([a-z-]+)`[^|]*\\| `([^`]*)`").FindAllStringSubmatch(string(readme), -1)
	if len(rows) < 8 {
		t.Fatalf("found %d flag rows in the README", len(rows))
	}
	for _, r := range rows {
		flag, documented := r[1], r[2]
		switch got, ok := defaults[flag]; {
		case flag == "zap-encoder":
			cmd := exec.Command(bin, "--metrics-bind-address=0")
			cmd.Env = []string{"HOME=" + t.TempDir()} // no kubeconfig: it logs the error and stops
			out, _ := cmd.CombinedOutput()
			encoding := "console"
			if strings.HasPrefix(strings.TrimSpace(string(out)), "{") {
				encoding = "json"
			}
			if documented != encoding {
				t.Errorf("README says --zap-encoder defaults to %q; the manager logs %s by default:\n%.300s", documented, encoding, out)
			}
		case !ok:
			t.Errorf("README documents --%s with default %q; --help shows no default for it", flag, documented)
		case got != documented && !sameDuration(got, documented):
			t.Errorf("README says --%s defaults to %q; --help says %q", flag, documented, got)
		}
	}
}

func sameDuration(a, b string) bool {
	da, errA := time.ParseDuration(a)
	db, errB := time.ParseDuration(b)
	return errA == nil && errB == nil && da == db
}
