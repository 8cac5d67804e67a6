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

// aclUser is one user of the aclfile.
type aclUser struct {
	Username string
	Password string
}

// usernamePattern is what keyroll accepts as a Redis username in an aclfile: Vault's Redis plugin
// makes names such as V_TOKEN_ORDERS_AB12CD_1700000000.
var usernamePattern = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,256}$`)

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
		if u.Password == "" {
			return "", fmt.Errorf("user %s has an empty password", u.Username)
		}
		sum := sha256.Sum256([]byte(u.Password))
		fmt.Fprintf(&b, "user %s on #%s resetkeys resetchannels -@all %s\n", u.Username, hex.EncodeToString(sum[:]), strings.Join(rules, " "))
	}
	return b.String(), nil
}

// credentialVersion identifies a credential: a hash of its username and password. Neither can be
// recovered from it; it changes whenever the credential does, and is the same for the same credential.
func credentialVersion(username, password string) string {
	sum := sha256.Sum256([]byte("keyroll/v1\x00" + username + "\x00" + password))
	return hex.EncodeToString(sum[:8])
}
