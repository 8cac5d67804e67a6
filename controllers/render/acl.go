package render

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// ACLFileKey is the key of the aclfile in the ACL Secret that Redis pods mount.
const ACLFileKey = "users.acl"

// ReloadPasswordKey is the key, in the ACL Secret, of the password of the reload user: a Redis
// user that may only reload the aclfile (ACL LOAD). Each Redis pod reloads its aclfile with it when
// the mounted Secret changes, so that a revoked user is forgotten without a restart.
const ReloadPasswordKey = "reload-password"

// reloadUser is the name of the reload user, and reloadRules all it may do.
const reloadUser = "keyroll-reload"

var reloadRules = []string{"+acl|load", "+ping"}

// aclUser is one user of the aclfile, with the SHA-256 hash of its password (hex).
type ACLUser struct {
	Username     string
	PasswordHash string
	// Rules, when set, replace the cluster's aclRules for this user.
	Rules []string
}

// newACLUser hashes a password for the aclfile.
func NewACLUser(username, password string) ACLUser {
	sum := sha256.Sum256([]byte(password))
	return ACLUser{Username: username, PasswordHash: hex.EncodeToString(sum[:])}
}

// ValidUsername says whether keyroll accepts u as a Redis user name (in an aclfile).
func ValidUsername(u string) bool { return usernamePattern.MatchString(u) }

// usernamePattern is what keyroll accepts as a Redis username in an aclfile: Vault's Redis plugin
// makes names such as V_TOKEN_ORDERS_AB12CD_1700000000.
var usernamePattern = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,256}$`)

var hashPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// renderACLFile renders a Redis aclfile: the default user off, and each user on with the given
// rules. Passwords appear only as SHA-256 hashes (#<hex>), so no character of a password needs
// escaping and the file never holds a password in clear.
func RenderACLFile(users []ACLUser, rules []string) (string, error) {
	var b strings.Builder
	b.WriteString("user default off\n")
	for _, u := range users {
		if !usernamePattern.MatchString(u.Username) {
			return "", fmt.Errorf("username %q cannot be written to an aclfile: only letters, digits and _ . @ - are accepted", u.Username)
		}
		if !hashPattern.MatchString(u.PasswordHash) {
			return "", fmt.Errorf("user %s: malformed password hash", u.Username)
		}
		r := rules
		if u.Rules != nil {
			r = u.Rules
		}
		fmt.Fprintf(&b, "user %s on #%s resetkeys resetchannels -@all %s\n", u.Username, u.PasswordHash, strings.Join(r, " "))
	}
	return b.String(), nil
}

// parseACLUsers reads the users (name and password hash) of an aclfile that renderACLFile wrote.
func ParseACLUsers(file string) map[string]ACLUser {
	users := map[string]ACLUser{}
	for _, line := range strings.Split(file, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "user" || f[2] != "on" || !strings.HasPrefix(f[3], "#") {
			continue
		}
		users[f[1]] = ACLUser{Username: f[1], PasswordHash: strings.TrimPrefix(f[3], "#")}
	}
	return users
}

// credentialVersion identifies a credential: a hash of its username and password. Neither can be
// recovered from it; it changes whenever the credential does, and is the same for the same credential.
func CredentialVersion(username, password string) string {
	sum := sha256.Sum256([]byte("keyroll/v1\x00" + username + "\x00" + password))
	return hex.EncodeToString(sum[:8])
}

// ACLFile renders the aclfile: the current user (none while a revoked credential awaits its
// replacement), the users of superseded leases that are not revoked yet (taken over from the
// aclfile as it is, where only their password hashes are), and the reload user.
func ACLFile(rc *v1alpha1.RedisCluster, cred *Credential, existing map[string]ACLUser, reloadPassword string) (string, error) {
	var users []ACLUser
	if cred != nil {
		users = append(users, NewACLUser(cred.Username, cred.Password))
	}
	keep := func(name string) {
		if u, ok := existing[name]; ok && !slices.ContainsFunc(users, func(x ACLUser) bool { return x.Username == name }) {
			users = append(users, u)
		}
	}
	for _, l := range rc.Status.Leases {
		if l.State != v1alpha1.LeaseActive {
			keep(l.Username)
		}
	}
	if c := rc.Status.Credential; c != nil {
		for _, name := range c.SupersededUsers {
			keep(name)
		}
	}
	reload := NewACLUser(reloadUser, reloadPassword)
	reload.Rules = reloadRules
	return RenderACLFile(append(users, reload), rc.Spec.Credentials.ACLRules)
}

// RandomPassword is 32 random bytes, hex-encoded.
func RandomPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a password: %w", err)
	}
	return hex.EncodeToString(b), nil
}
