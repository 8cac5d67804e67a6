package render

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keyroll/keyroll/apis/v1beta1"
	"github.com/keyroll/keyroll/test/testground"
)

func user(name, password string, rules ...string) ACLUser {
	return ACLUser{Username: name, PasswordHash: HashPassword(password), Rules: rules}
}

// The aclfile keyroll renders is loaded by a real redis-server, and the users in it authenticate
// with their passwords, including passwords whose characters would need care in an aclfile.
func TestACLFileLoadsInRealRedis(t *testing.T) {
	users := map[string]string{
		"V_TOKEN_ORDERS_AB12CD_1700000000": "A1a-plain-vault-password",
		"tricky":                           "sp ace \"quote\" #hash >gt <lt 'single' \\back\nnewline ünï",
		"admin":                            "admin-password-for-this-test",
	}
	var list []ACLUser
	for u, p := range users {
		list = append(list, user(u, p, "~*", "&*", "+@all"))
	}
	file, err := RenderACLFile(list)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range users {
		if strings.Contains(file, p) {
			t.Fatal("a password appears in clear in the aclfile")
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "users.acl")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := testground.StartRedis(dir, "--aclfile", path)
	if err != nil {
		t.Fatalf("redis-server refused the aclfile keyroll renders: %v\n%s", err, file)
	}
	t.Cleanup(r.Stop)
	for u, p := range users {
		if who, err := r.WhoAmI(u, p); err != nil || who != u {
			t.Errorf("user %q does not authenticate: %q, %v", u, who, err)
		}
		if _, err := r.WhoAmI(u, p+"x"); err == nil {
			t.Errorf("user %q authenticates with a wrong password", u)
		}
	}
	if _, err := r.WhoAmI("default", ""); err == nil {
		t.Error("the default user is not off")
	}
}

func TestACLFileRules(t *testing.T) {
	cases := map[string]struct {
		users   []ACLUser
		wantErr string
		want    string
	}{
		"rules follow a reset":    {users: []ACLUser{user("app", "pw", "~orders:*", "+get", "+set")}, want: "resetkeys resetchannels -@all ~orders:* +get +set"},
		"username with a space":   {users: []ACLUser{user("bad user", "pw", "~*")}, wantErr: "cannot be written"},
		"username with a newline": {users: []ACLUser{user("a\nuser default on nopass", "pw", "~*")}, wantErr: "cannot be written"},
		"malformed hash":          {users: []ACLUser{{Username: "u", PasswordHash: "zz"}}, wantErr: "malformed"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := RenderACLFile(tc.users)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want error %q, got %v", tc.wantErr, err)
				}
				return
			}
			if err != nil || !strings.Contains(got, tc.want) || !strings.HasPrefix(got, "user default off\n") {
				t.Fatalf("got %q, %v", got, err)
			}
		})
	}
}

func TestParseACLUsersReadsWhatRenderWrites(t *testing.T) {
	in := []ACLUser{user("a", "1", "~*", "+@all"), user("b", "2", "+psync", "+replconf")}
	file, err := RenderACLFile(in)
	if err != nil {
		t.Fatal(err)
	}
	got := ParseACLUsers(file)
	same := func(a, b ACLUser) bool {
		return a.Username == b.Username && a.PasswordHash == b.PasswordHash && slices.Equal(a.Rules, b.Rules)
	}
	if len(got) != 2 || !same(got["a"], in[0]) || !same(got["b"], in[1]) {
		t.Fatalf("parsed %+v from %q", got, file)
	}
}

func TestCredentialVersion(t *testing.T) {
	v := CredentialVersion("u", "p")
	if v != CredentialVersion("u", "p") || v == CredentialVersion("u", "q") || v == CredentialVersion("v", "p") || len(v) != 16 {
		t.Fatalf("credential versions must be stable per credential and differ between credentials: %s", v)
	}
}

// keyroll's own users have rules of their own, whatever aclRules say; the app users have aclRules,
// then the rules that deny them keyroll's commands.
func TestClusterUsersGiveKeyrollsUsersTheirOwnRules(t *testing.T) {
	rc := &v1beta1.RedisCluster{}
	rc.Spec.Credentials.ACLRules = []string{"~app:*", "+@read", "-@dangerous"}
	in := Internal{Admin: "a", Replication: "r", Probe: "p", VaultPlugin: &ACLUser{Username: "vault", PasswordHash: HashPassword("v")}}
	u := ClusterUsers(rc, in, AppUsers(rc, &Credential{Username: "app", Password: "x"}, nil))
	rules := map[string][]string{}
	for _, x := range u.All {
		rules[x.Username] = x.Rules
	}
	want := map[string][]string{
		AdminUser: adminRules, RecoveryUser: adminRules, ReplicationUser: {"+psync", "+replconf", "+ping"}, ProbeUser: {"+ping", "+info"},
		"vault": VaultPluginRules, "app": append([]string{"~app:*", "+@read", "-@dangerous"}, AppDenyRules...),
	}
	for name, w := range want {
		if !slices.Equal(rules[name], w) {
			t.Errorf("%s has rules %v, want %v", name, rules[name], w)
		}
	}
	if len(rules) != len(want) {
		t.Errorf("users %v", rules)
	}
	file, err := u.ACLFile()
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"a", "r", "p", "v", "x"} {
		if strings.Contains(file, "#"+secret+" ") || strings.Contains(file, ">"+secret) {
			t.Errorf("password %q in clear in the aclfile", secret)
		}
	}
}

// The users of replaced credentials stay until the rollout is done: those of superseded leases,
// and those of credentials whose leases are not tracked; retiring users are left out, and the
// version says what changed.
func TestAppUsersKeepReplacedUsersUntilTheyRetire(t *testing.T) {
	existing := map[string]ACLUser{
		"leased":    user("leased", "1"),
		"untracked": user("untracked", "2"),
		"revoked":   user("revoked", "3"),
		"revoking":  user("revoking", "4"),
	}
	rc := &v1beta1.RedisCluster{}
	rc.Spec.Credentials.ACLRules = []string{"~*"}
	rc.Status.Leases = []v1beta1.LeaseRecord{
		{LeaseID: "l1", State: v1beta1.LeaseSuperseded, Username: "leased"},
		{LeaseID: "l2", State: v1beta1.LeaseActive, Username: "current"},
		{LeaseID: "l3", State: v1beta1.LeaseRevoking, Username: "revoking"},
	}
	rc.Status.Credential = &v1beta1.CredentialStatus{Username: "current", SupersededUsers: []string{"untracked"}}
	in := Internal{Admin: "a", Replication: "r", Probe: "p"}
	u := ClusterUsers(rc, in, AppUsers(rc, &Credential{Username: "current", Password: "p"}, existing))
	for _, name := range []string{"current", "leased", "untracked", AdminUser} {
		if !u.Has(name) {
			t.Errorf("%s is missing", name)
		}
	}
	for _, name := range []string{"revoked", "revoking"} {
		if u.Has(name) {
			t.Errorf("%s, neither current nor in use, stays", name)
		}
	}
	before := u.Version()
	rc.Status.RetiringUsers = []string{"leased"}
	retiring := ClusterUsers(rc, in, AppUsers(rc, &Credential{Username: "current", Password: "p"}, existing))
	if retiring.Has("leased") || !slices.Equal(retiring.Retiring, []string{"leased"}) || retiring.Version() == before {
		t.Errorf("a retiring user: %+v", retiring)
	}
	if retiring.WithoutRetiring().Version() == retiring.Version() {
		t.Error("the version does not tell a set with retiring users from one without")
	}
}

// The application user's rules end with the deny rules, unless the owner opted out of them; the
// recovery user's password is derived from the admin password, differs from it, and is stable.
func TestAppRulesEndWithTheDenyRules(t *testing.T) {
	rc := &v1beta1.RedisCluster{}
	rc.Spec.Credentials.ACLRules = []string{"~*", "+@all"}
	if got := AppRules(rc); !slices.Equal(got, append([]string{"~*", "+@all"}, AppDenyRules...)) {
		t.Errorf("AppRules %v", got)
	}
	if !slices.Equal(rc.Spec.Credentials.ACLRules, []string{"~*", "+@all"}) {
		t.Errorf("AppRules changed the spec: %v", rc.Spec.Credentials.ACLRules)
	}
	key := RulesKey(rc)
	rc.Spec.Credentials.UnsafeAllowAdminCommands = true
	if got := AppRules(rc); !slices.Equal(got, []string{"~*", "+@all"}) {
		t.Errorf("AppRules with unsafeAllowAdminCommands %v", got)
	}
	if RulesKey(rc) == key {
		t.Error("the rules key does not change with unsafeAllowAdminCommands: the rules would not be checked again")
	}
	if r := RecoveryPassword("a"); r == "a" || r != RecoveryPassword("a") || r == RecoveryPassword("b") || len(r) != 64 {
		t.Errorf("RecoveryPassword(a) = %q", r)
	}
}

// Each command AppDenyRules deny is one of Redis's own @admin commands (ACL CAT admin lists it, or
// subcommands of it) on the Redis the test ground runs (7.0); Redis takes the deny rules after
// +@all, and the user they end up with may run ordinary commands and none of those.
func TestAppDenyRulesAreRedisAdminCommands(t *testing.T) {
	r, err := testground.StartRedis(t.TempDir())
	if err != nil {
		t.Fatalf("starting redis-server (apt-get install redis-server): %v", err)
	}
	defer r.Stop()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), Username: r.AdminUser, Password: r.AdminPassword, Protocol: 2, DisableIdentity: true})
	defer c.Close()
	admin, err := c.Do(context.Background(), "ACL", "CAT", "admin").StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	rc := &v1beta1.RedisCluster{}
	rc.Spec.Credentials.ACLRules = []string{"~*", "&*", "+@all"}
	args := append([]string{"ACL", "SETUSER", "app", "reset", "on", ">p"}, AppRules(rc)...)
	if _, err := r.Do(r.AdminUser, r.AdminPassword, args...); err != nil {
		t.Fatalf("Redis refused the application user's rules: %v", err)
	}
	for _, deny := range AppDenyRules {
		cmd := strings.TrimPrefix(deny, "-")
		if !slices.ContainsFunc(admin, func(c string) bool { return c == cmd || strings.HasPrefix(c, cmd+"|") }) {
			t.Errorf("%s is not an @admin command of this Redis: %v", cmd, admin)
		}
		call := []string{cmd}
		if i := slices.IndexFunc(admin, func(c string) bool { return strings.HasPrefix(c, cmd+"|") }); i >= 0 && !slices.Contains(admin, cmd) {
			call = strings.Split(admin[i], "|") // a container command: one of its subcommands
		}
		var out string
		for range 4 { // as many arguments as the command's arity asks for
			if out, err = r.Do(r.AdminUser, r.AdminPassword, append([]string{"ACL", "DRYRUN", "app"}, call...)...); err == nil || !strings.Contains(err.Error(), "wrong number of arguments") {
				break
			}
			call = append(call, "1")
		}
		if err != nil || !strings.Contains(out, "no permissions") {
			t.Errorf("ACL DRYRUN app %v: %q, %v; want no permissions", call, out, err)
		}
	}
	for _, ok := range [][]string{{"GET", "k"}, {"SET", "k", "v"}, {"KEYS", "*"}, {"FLUSHALL"}, {"INFO"}} {
		if out, err := r.Do(r.AdminUser, r.AdminPassword, append([]string{"ACL", "DRYRUN", "app"}, ok...)...); err != nil || out != "OK" {
			t.Errorf("ACL DRYRUN app %v: %q, %v; want OK", ok, out, err)
		}
	}
}
