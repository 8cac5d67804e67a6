package render

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// ACLFileKey is the key of the aclfile in the ACL Secret that Redis pods mount.
const ACLFileKey = "users.acl"

// keyroll's own users on every node of a cluster, each with just the commands it needs, and none
// changed by a rotation or by aclRules.
const (
	// AdminUser is the user keyroll changes the other users with, node by node. Its password is in
	// the state Secret, which no pod mounts.
	AdminUser = "keyroll-admin"
	// ReplicationUser is the user replicas authenticate to their primary as (masteruser).
	ReplicationUser = "keyroll-repl"
	// ProbeUser is the user of the probes (startup, liveness, readiness).
	ProbeUser = "keyroll-probe"
	// RecoveryUser is keyroll's second administrative user, with AdminUser's rules: keyroll logs
	// in as it on a node where AdminUser was changed outside keyroll, to set AdminUser back. Its
	// password is derived from the admin password (Internal.RecoveryPassword), so that nothing
	// more needs to be kept.
	RecoveryUser = "keyroll-recovery"
)

// AppDenyRules follow spec.credentials.aclRules on the application user (unless
// unsafeAllowAdminCommands): whatever the owner's rules grant, the application user cannot run
// the commands that take a node over from keyroll. Each is an @admin command of every Redis
// keyroll supports (6.2 and later), denied whole: Redis before 7.0 takes no -command|subcommand.
var AppDenyRules = []string{
	"-acl",                                                   // its users, keyroll's among them
	"-replicaof", "-slaveof", "-sync", "-psync", "-replconf", // replication
	"-failover",
	"-config", // CONFIG GET would read masterauth, the replication user's password
	"-shutdown",
	"-module",
	"-debug", "-monitor", // MONITOR shows every command of every client
	"-cluster",
}

// AppRules are the rules of rc's application users: spec.credentials.aclRules, then
// AppDenyRules unless the owner opted out of them.
func AppRules(rc *v1beta1.RedisCluster) []string {
	rules := slices.Clone(rc.Spec.Credentials.ACLRules)
	if rc.Spec.Credentials.UnsafeAllowAdminCommands {
		return rules
	}
	return append(rules, AppDenyRules...)
}

var (
	adminRules       = []string{"+@connection", "+acl", "+info", "+role", "+failover", "+replicaof"}
	replicationRules = []string{"+psync", "+replconf", "+ping"}
	probeRules       = []string{"+ping", "+info"}
	// tlsAdminRules let the admin users of a TLS cluster make a node read its renewed certificate
	// files (CONFIG SET tls-cert-file ...). They add no power: +acl could grant any command.
	tlsAdminRules = []string{"+config|set"}
	// VaultPluginRules are what Vault's Redis database plugin runs: it creates users (ACL SETUSER),
	// deletes them (ACL DELUSER) and looks them up before a password change (ACL GETUSER).
	VaultPluginRules = []string{"+ping", "+acl|setuser", "+acl|deluser", "+acl|getuser"}
)

// ACLUser is one user of a cluster's nodes: its name, the SHA-256 of its password (hex) and its
// rules.
type ACLUser struct {
	Username     string
	PasswordHash string
	Rules        []string
}

// HashPassword is the SHA-256 of a password, hex, as an aclfile and ACL SETUSER take it.
func HashPassword(password string) string {
	sum := sha256.Sum256([]byte(password))
	return hex.EncodeToString(sum[:])
}

// ValidUsername says whether keyroll accepts u as a Redis user name (in an aclfile).
func ValidUsername(u string) bool { return usernamePattern.MatchString(u) }

// usernamePattern is what keyroll accepts as a Redis username in an aclfile: Vault's Redis plugin
// makes names such as V_TOKEN_ORDERS_AB12CD_1700000000.
var usernamePattern = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,256}$`)

var hashPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// aclLinePrefix is what every user line of keyroll's aclfile starts its rules with: the rules
// that follow are all the user has.
const aclLinePrefix = "resetkeys resetchannels -@all"

// RenderACLFile renders a Redis aclfile: the default user off, and each user on with its rules.
// Passwords appear only as SHA-256 hashes (#<hex>), so no character of a password needs escaping
// and the file never holds a password in clear.
func RenderACLFile(users []ACLUser) (string, error) {
	var b strings.Builder
	b.WriteString("user default off\n")
	for _, u := range users {
		if !usernamePattern.MatchString(u.Username) {
			return "", fmt.Errorf("username %q cannot be written to an aclfile: only letters, digits and _ . @ - are accepted", u.Username)
		}
		if !hashPattern.MatchString(u.PasswordHash) {
			return "", fmt.Errorf("user %s: malformed password hash", u.Username)
		}
		fmt.Fprintf(&b, "user %s on #%s %s %s\n", u.Username, u.PasswordHash, aclLinePrefix, strings.Join(u.Rules, " "))
	}
	return b.String(), nil
}

// ParseACLUsers reads the users (name, password hash and rules) of an aclfile that RenderACLFile
// wrote.
func ParseACLUsers(file string) map[string]ACLUser {
	users := map[string]ACLUser{}
	for _, line := range strings.Split(file, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "user" || f[2] != "on" || !strings.HasPrefix(f[3], "#") {
			continue
		}
		rules := strings.Fields(strings.TrimPrefix(strings.Join(f[4:], " "), aclLinePrefix))
		users[f[1]] = ACLUser{Username: f[1], PasswordHash: strings.TrimPrefix(f[3], "#"), Rules: rules}
	}
	return users
}

// CredentialVersion identifies a credential: a hash of its username and password. Neither can be
// recovered from it; it changes whenever the credential does, and is the same for the same credential.
func CredentialVersion(username, password string) string {
	sum := sha256.Sum256([]byte("keyroll/v1\x00" + username + "\x00" + password))
	return hex.EncodeToString(sum[:8])
}

// Internal are the passwords of keyroll's own users of a cluster, and the Vault plugin's user
// when spec.vaultPlugin asks for one.
type Internal struct {
	Admin, Replication, Probe string
	// VaultPlugin is the plugin's user (name and password hash), or nil.
	VaultPlugin *ACLUser
}

// RecoveryPassword is the password of RecoveryUser: an HMAC of the admin password, so that it is
// as secret as that one and needs no place of its own.
func RecoveryPassword(admin string) string {
	m := hmac.New(sha256.New, []byte(admin))
	m.Write([]byte("keyroll/recovery-user"))
	return hex.EncodeToString(m.Sum(nil))
}

// Users is the set of users every node of a cluster must have, and the users it must not have
// (Retiring), in the order they are applied.
type Users struct {
	All      []ACLUser
	Retiring []string
	// App names the application users among All (the credentials' users).
	App []string
}

// ClusterUsers is what every node of rc must have: keyroll's own users, the Vault plugin's user,
// and app, the app users (AppUsers), minus the retiring ones.
func ClusterUsers(rc *v1beta1.RedisCluster, in Internal, app []ACLUser) Users {
	admin := adminRules
	if TLSEnabled(rc) {
		admin = append(slices.Clone(adminRules), tlsAdminRules...)
	}
	u := Users{All: []ACLUser{
		{Username: AdminUser, PasswordHash: HashPassword(in.Admin), Rules: admin},
		{Username: RecoveryUser, PasswordHash: HashPassword(RecoveryPassword(in.Admin)), Rules: admin},
		{Username: ReplicationUser, PasswordHash: HashPassword(in.Replication), Rules: replicationRules},
		{Username: ProbeUser, PasswordHash: HashPassword(in.Probe), Rules: probeRules},
	}}
	if in.VaultPlugin != nil {
		p := *in.VaultPlugin
		p.Rules = VaultPluginRules
		u.All = append(u.All, p)
	}
	for _, a := range app {
		if !slices.Contains(rc.Status.RetiringUsers, a.Username) && !u.Has(a.Username) {
			u.All = append(u.All, a)
			u.App = append(u.App, a.Username)
		}
	}
	u.Retiring = slices.Clone(rc.Status.RetiringUsers)
	return u
}

// Has says whether the set has a user of that name.
func (u Users) Has(name string) bool {
	return slices.ContainsFunc(u.All, func(x ACLUser) bool { return x.Username == name })
}

// Version identifies the set (a hash of the users' names, password hashes and rules, and of the
// retiring names): a node confirmed on a version has exactly that.
func (u Users) Version() string {
	h := sha256.New()
	for _, x := range u.All {
		fmt.Fprintf(h, "user\x00%s\x00%s\x00%s\n", x.Username, x.PasswordHash, strings.Join(x.Rules, " "))
	}
	for _, name := range u.Retiring {
		fmt.Fprintf(h, "retire\x00%s\n", name)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// WithoutRetiring is the set once the retiring users are gone from every node.
func (u Users) WithoutRetiring() Users { return Users{All: u.All, App: u.App} }

// ACLFile renders the aclfile of the set.
func (u Users) ACLFile() (string, error) { return RenderACLFile(u.All) }

// AppUsers are the app users of rc's nodes, each with AppRules: the current
// credential (nil: none, or not yet applied), and the users of superseded credentials that the
// rollout still needs, taken over from the aclfile as it is (existing), where only their password
// hashes are.
func AppUsers(rc *v1beta1.RedisCluster, cred *Credential, existing map[string]ACLUser) []ACLUser {
	rules := AppRules(rc)
	var users []ACLUser
	if cred != nil {
		users = append(users, ACLUser{Username: cred.Username, PasswordHash: HashPassword(cred.Password), Rules: rules})
	}
	keep := func(name string) {
		u, ok := existing[name]
		if ok && !slices.ContainsFunc(users, func(x ACLUser) bool { return x.Username == name }) {
			users = append(users, ACLUser{Username: name, PasswordHash: u.PasswordHash, Rules: rules})
		}
	}
	for _, name := range rc.SupersededUsernames() {
		keep(name)
	}
	return users
}

// RulesKey identifies the app users' rules (AppRules) and the Redis image they were checked against: rules Redis
// accepted once are not checked again until either changes.
func RulesKey(rc *v1beta1.RedisCluster) string {
	sum := sha256.Sum256([]byte(rc.Spec.Image + ":" + rc.Spec.Version + "\x00" + strings.Join(AppRules(rc), "\x00")))
	return hex.EncodeToString(sum[:8])
}

// RandomPassword is 32 random bytes, hex-encoded.
func RandomPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a password: %w", err)
	}
	return hex.EncodeToString(b), nil
}
