package render

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/keyroll/keyroll/apis/v1alpha1"
	"github.com/keyroll/keyroll/test/testground"
)

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
		list = append(list, NewACLUser(u, p))
	}
	file, err := RenderACLFile(list, []string{"~*", "&*", "+@all"})
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
		rules   []string
		wantErr string
		want    string
	}{
		"rules follow a reset": {
			users: []ACLUser{NewACLUser("app", "pw")}, rules: []string{"~orders:*", "+get", "+set"},
			want: "resetkeys resetchannels -@all ~orders:* +get +set",
		},
		"username with a space":   {users: []ACLUser{NewACLUser("bad user", "pw")}, rules: []string{"~*"}, wantErr: "cannot be written"},
		"username with a newline": {users: []ACLUser{NewACLUser("a\nuser default on nopass", "pw")}, rules: []string{"~*"}, wantErr: "cannot be written"},
		"malformed hash":          {users: []ACLUser{{Username: "u", PasswordHash: "zz"}}, rules: []string{"~*"}, wantErr: "malformed"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := RenderACLFile(tc.users, tc.rules)
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
	in := []ACLUser{NewACLUser("a", "1"), NewACLUser("b", "2")}
	file, err := RenderACLFile(in, []string{"~*"})
	if err != nil {
		t.Fatal(err)
	}
	got := ParseACLUsers(file)
	same := func(a, b ACLUser) bool { return a.Username == b.Username && a.PasswordHash == b.PasswordHash }
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

// The aclfile holds the current user and the reload user, whose rules allow ACL LOAD and nothing
// else (no keys, no channels), whatever the cluster's aclRules are.
func TestACLFileHasTheReloadUserWithItsOwnRules(t *testing.T) {
	rc := &v1alpha1.RedisCluster{}
	rc.Spec.Credentials.ACLRules = []string{"~orders:*", "+@all"}
	file, err := ACLFile(rc, &Credential{Username: "app", Password: "p"}, nil, "reload-secret")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"user default off",
		"user app on #" + NewACLUser("app", "p").PasswordHash + " resetkeys resetchannels -@all ~orders:* +@all",
		"user keyroll-reload on #" + NewACLUser("keyroll-reload", "reload-secret").PasswordHash + " resetkeys resetchannels -@all +acl|load +ping",
	}
	if got := strings.Split(strings.TrimSpace(file), "\n"); !slices.Equal(got, want) {
		t.Fatalf("aclfile:\n%s\nwant:\n%s", file, strings.Join(want, "\n"))
	}
	if strings.Contains(file, "reload-secret") {
		t.Fatal("the aclfile holds the reload password in clear")
	}
}

// The users of replaced credentials stay in the aclfile until the rollout is done: those of
// superseded leases, and those of credentials whose leases are not tracked.
func TestACLFileKeepsReplacedUsersUntilTheRolloutIsDone(t *testing.T) {
	existing := map[string]ACLUser{
		"leased":    NewACLUser("leased", "1"),
		"untracked": NewACLUser("untracked", "2"),
		"revoked":   NewACLUser("revoked", "3"),
	}
	rc := &v1alpha1.RedisCluster{}
	rc.Status.Leases = []v1alpha1.LeaseRecord{
		{LeaseID: "l1", State: v1alpha1.LeaseSuperseded, Username: "leased"},
		{LeaseID: "l2", State: v1alpha1.LeaseActive, Username: "current"},
	}
	rc.Status.Credential = &v1alpha1.CredentialStatus{Username: "current", SupersededUsers: []string{"untracked"}}
	file, err := ACLFile(rc, &Credential{Username: "current", Password: "p"}, existing, "r")
	if err != nil {
		t.Fatal(err)
	}
	users := ParseACLUsers(file)
	for _, name := range []string{"current", "leased", "untracked", reloadUser} {
		if _, ok := users[name]; !ok {
			t.Errorf("%s is missing from the aclfile:\n%s", name, file)
		}
	}
	if _, ok := users["revoked"]; ok {
		t.Errorf("a user that is neither current nor replaced stays in the aclfile:\n%s", file)
	}
	if users["untracked"].PasswordHash != existing["untracked"].PasswordHash {
		t.Error("a replaced user's password hash changed")
	}
}
