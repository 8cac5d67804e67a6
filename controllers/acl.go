package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
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
type aclUser struct {
	Username     string
	PasswordHash string
	// Rules, when set, replace the cluster's aclRules for this user.
	Rules []string
}

// newACLUser hashes a password for the aclfile.
func newACLUser(username, password string) aclUser {
	sum := sha256.Sum256([]byte(password))
	return aclUser{Username: username, PasswordHash: hex.EncodeToString(sum[:])}
}

// usernamePattern is what keyroll accepts as a Redis username in an aclfile: Vault's Redis plugin
// makes names such as V_TOKEN_ORDERS_AB12CD_1700000000.
var usernamePattern = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,256}$`)

var hashPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// renderACLFile renders a Redis aclfile: the default user off, and each user on with the given
// rules. Passwords appear only as SHA-256 hashes (#<hex>), so no character of a password needs
// escaping and the file never holds a password in clear.
func renderACLFile(users []aclUser, rules []string) (string, error) {
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
func parseACLUsers(file string) map[string]aclUser {
	users := map[string]aclUser{}
	for _, line := range strings.Split(file, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "user" || f[2] != "on" || !strings.HasPrefix(f[3], "#") {
			continue
		}
		users[f[1]] = aclUser{Username: f[1], PasswordHash: strings.TrimPrefix(f[3], "#")}
	}
	return users
}

// credentialVersion identifies a credential: a hash of its username and password. Neither can be
// recovered from it; it changes whenever the credential does, and is the same for the same credential.
func credentialVersion(username, password string) string {
	sum := sha256.Sum256([]byte("keyroll/v1\x00" + username + "\x00" + password))
	return hex.EncodeToString(sum[:8])
}
