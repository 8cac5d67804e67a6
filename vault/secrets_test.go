package vault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

const (
	testJWT      = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLXZhbHVl"
	testPassword = "A1a-Pass-9f8e7d6c5b4a"
	testUsername = "V_TOKEN_ORDERS_ZYXWVU_1767323045"
)

// fmtAll renders v in every way a careless caller might print it.
func fmtAll(v any) string {
	return fmt.Sprintf("%v | %+v | %#v | %s", v, v, v, v)
}

// echo answers with code and an error that quotes everything the request carried (its token
// header and its body) and the extra values. Vault does not do that, but a proxy or a plugin might.
func echo(code int, extra ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		msg := fmt.Sprintf("you sent token %s and body %s", r.Header.Get("X-Vault-Token"), body)
		writeErrors(w, code, append([]string{msg}, extra...)...)
	}
}

// echoRaw answers with a body that is not JSON and quotes the request.
func echoRaw(code int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(code)
		fmt.Fprintf(w, "<html>token=%s body=%s</html>", r.Header.Get("X-Vault-Token"), body)
	}
}

// failurePaths drives every way a call can fail against a server that echoes secrets, and
// returns what the caller gets to see: errors and warnings.
var failurePaths = map[string]func(t *testing.T, c *testClient) []any{
	"approle login refused": func(t *testing.T, c *testClient) []any {
		c.vault.handle("auth/approle/login", echo(400))
		return []any{c.Login(context.Background())}
	},
	"approle login failing": func(t *testing.T, c *testClient) []any {
		c.vault.handle("auth/approle/login", echo(500))
		_, err := c.Issue(context.Background(), credsPath)
		return []any{err}
	},
	"approle login answering html": func(t *testing.T, c *testClient) []any {
		c.vault.handle("auth/approle/login", echoRaw(400))
		return []any{c.Login(context.Background())}
	},
	"kubernetes login refused": func(t *testing.T, c *testClient) []any {
		c.cfg.Auth = Auth{Kubernetes: &KubernetesAuth{Mount: "kubernetes", Role: "r", JWT: func(context.Context) (string, error) { return testJWT, nil }}}
		c.vault.handle("auth/kubernetes/login", echo(403, "jwt was "+testJWT))
		return []any{c.Login(context.Background())}
	},
	"kubernetes token source failing": func(t *testing.T, c *testClient) []any {
		c.cfg.Auth = Auth{Kubernetes: &KubernetesAuth{Mount: "kubernetes", Role: "r", JWT: func(context.Context) (string, error) {
			return "", errors.New("token request answered " + testJWT)
		}}}
		return []any{c.Login(context.Background())}
	},
	"static token lookup failing": func(t *testing.T, c *testClient) []any {
		c.cfg.Auth = Auth{Token: &TokenAuth{Token: testToken}}
		c.secrets.add(testToken)
		c.vault.handle("auth/token/lookup-self", echo(500))
		_, err := c.Issue(context.Background(), credsPath)
		return []any{err}
	},
	"every lease operation failing": func(t *testing.T, c *testClient) []any {
		loginAndIssue(t, c)
		c.vault.handle("sys/leases/renew", echo(500, "password "+testPassword))
		c.vault.handle("sys/leases/lookup", echo(403, "user "+testUsername+" password "+testPassword))
		c.vault.handle("sys/leases/revoke", echoRaw(502))
		c.vault.handle(credsPath, echo(404, testPassword))
		ctx := context.Background()
		_, e1 := c.Renew(ctx, "l", time.Hour)
		_, e2 := c.Lookup(ctx, "l")
		e3 := c.Revoke(ctx, "l")
		_, e4 := c.Issue(ctx, credsPath)
		return []any{e1, e2, e3, e4}
	},
	"invalid token, then a failing login": func(t *testing.T, c *testClient) []any {
		loginAndIssue(t, c)
		c.vault.handle(credsPath, func(w http.ResponseWriter, r *http.Request) {
			writeErrors(w, 403, "permission denied", "invalid token "+r.Header.Get("X-Vault-Token"))
		})
		c.vault.handle("auth/approle/login", echo(400))
		_, err := c.Issue(context.Background(), credsPath)
		return []any{err}
	},
	"token renewal and login failing while the token is valid": func(t *testing.T, c *testClient) []any {
		loginAndIssue(t, c)
		c.vault.handle("auth/token/renew-self", echo(400))
		c.vault.handle("auth/approle/login", echo(500))
		c.clock.Step(41 * time.Minute)
		_, err := c.Issue(context.Background(), credsPath) // goes ahead: the token is valid for 19 minutes
		return []any{err}
	},
	"warnings quoting secrets": func(t *testing.T, c *testClient) []any {
		loginAndIssue(t, c)
		c.vault.handle("sys/leases/renew", renewOK(time.Hour, "renewed for "+testPassword+" with "+tokenA))
		r, err := c.Renew(context.Background(), "l", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return []any{r.Warnings, r}
	},
	"unreachable vault": func(t *testing.T, c *testClient) []any {
		loginAndIssue(t, c)
		c.vault.srv.Close()
		_, err := c.Renew(context.Background(), "l", time.Hour)
		return []any{err}
	},
	"answers that are not the JSON expected": func(t *testing.T, c *testClient) []any {
		loginAndIssue(t, c)
		tooBig := `{"lease_id": "l", "lease_duration": ` + bodyNumber + `}` // the decoder would quote the number
		c.vault.handle("sys/leases/renew", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, tooBig) })
		c.vault.handle("sys/leases/lookup", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"data": `+bodyNumber+`}`) })
		c.vault.handle(credsPath, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, tooBig) })
		c.vault.handle("sys/health", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, `{"server_time_utc": `+bodyNumber+`}`)
		})
		ctx := context.Background()
		_, e1 := c.Renew(ctx, "l", time.Hour)
		_, e2 := c.Lookup(ctx, "l")
		_, e3 := c.Issue(ctx, credsPath)
		_, e4 := c.Health(ctx)
		return []any{e1, e2, e3, e4}
	},
	"renewing a replaced token failing": func(t *testing.T, c *testClient) []any {
		loginAndIssue(t, c) // with token A
		c.vault.handle("auth/approle/login", loginOK(tokenB, time.Hour, true))
		if err := c.Login(context.Background()); err != nil {
			t.Fatal(err)
		}
		c.vault.handle("auth/token/renew-self", echo(400))
		c.clock.Step(41 * time.Minute)
		_, err := c.KeepTokens(context.Background(), map[string]time.Time{accessorFor(tokenA): c.clock.Now().Add(time.Hour)})
		return []any{err}
	},
	"taking over a stored token failing": func(t *testing.T, c *testClient) []any {
		c.cfg.Tokens = &memStore{tokens: map[string]string{accessorFor(tokenA): tokenA}}
		c.vault.handle("auth/token/lookup-self", echo(500))
		_, err := c.Issue(context.Background(), credsPath)
		return []any{err}
	},
	"token store refusing a new token": func(t *testing.T, c *testClient) []any {
		c.cfg.Tokens = echoStore{}
		c.vault.handle("auth/approle/login", loginOK(tokenA, time.Hour, true))
		_, err := c.Issue(context.Background(), credsPath)
		return []any{err}
	},
}

// bodyNumber is a piece of a response body that no error may quote.
const bodyNumber = "271828182845904523536028747135"

// echoStore is a TokenStore whose writes fail with an error that quotes what it was given.
type echoStore struct{}

func (echoStore) Load(context.Context) (map[string]string, error) { return nil, nil }

func (echoStore) Save(_ context.Context, put map[string]string, _ []string) error {
	return fmt.Errorf("cannot write %v", put)
}

// loginAndIssue logs in with tokenA and issues a credential with testPassword.
func loginAndIssue(t *testing.T, c *testClient) {
	t.Helper()
	c.vault.handle("auth/approle/login", loginOK(tokenA, time.Hour, true))
	c.vault.handle(credsPath, issueOK(credsPath+"/l", time.Hour, map[string]any{"username": testUsername, "password": testPassword}))
	l := mustIssue(t, c, context.Background())
	if l.Data["password"] != testPassword {
		t.Fatalf("issued data = %v", l.Data)
	}
}

// TestNoSecretInErrorsOrLogs feeds error text from every failure path, with a server that
// quotes the token, the secret ID, the service-account token and the password back, and checks
// that none of them reaches an error string (however printed, unwrapped or not) or a log line.
func TestNoSecretInErrorsOrLogs(t *testing.T) {
	secrets := []string{testToken, tokenA, tokenB, testSecretID, testRoleID, testJWT, testPassword, bodyNumber}
	// Paths whose failures are only logged, and paths where nothing echoes a secret to redact.
	noError := map[string]bool{"warnings quoting secrets": true, "token renewal and login failing while the token is valid": true}
	noEcho := map[string]bool{"unreachable vault": true, "approle login answering html": true, "answers that are not the JSON expected": true}
	logLinesSeen := 0
	t.Cleanup(func() {
		if logLinesSeen == 0 {
			t.Errorf("no log line was written: the test did not check any")
		}
	})
	for name, run := range failurePaths {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, nil)

			seen := run(t, c)

			var texts []string
			failed := false
			for _, v := range seen {
				if err, ok := v.(error); ok && err != nil {
					failed = true
					for e := err; e != nil; e = errors.Unwrap(e) {
						texts = append(texts, fmtAll(e))
					}
					continue
				}
				texts = append(texts, fmtAll(v))
			}
			if !noError[name] && !failed {
				t.Fatalf("no error came back: %v", seen)
			}
			logs := c.logs.all()
			logLinesSeen += len(logs)
			for _, text := range append(texts, logs...) {
				for _, s := range secrets {
					if strings.Contains(text, s) {
						t.Errorf("%q leaked into: %s", s, text)
					}
				}
			}
			if !strings.Contains(strings.Join(append(texts, logs...), "\n"), redacted) && !noEcho[name] {
				t.Errorf("nothing was redacted, so the test did not see the echoed secrets: %q", texts)
			}
		})
	}
}

func TestRedactor(t *testing.T) {
	cases := map[string]struct {
		known []string
		in    string
		want  string
	}{
		"known value":            {known: []string{"s3cr3t-value"}, in: "got s3cr3t-value twice: s3cr3t-value", want: "got [redacted] twice: [redacted]"},
		"longest first":          {known: []string{"abcd", "abcdefgh"}, in: "abcdefgh", want: "[redacted]"},
		"short values ignored":   {known: []string{"ab"}, in: "ab cab", want: "ab cab"},
		"vault token pattern":    {in: "token hvs.CAESIJaaaaaaaaaaaaaaaaaaaaaaaa here", want: "token [redacted] here"},
		"legacy token pattern":   {in: "token s.AbCdEfGhIjKlMnOpQrStUvWx", want: "token [redacted]"},
		"jwt pattern":            {in: "jwt " + testJWT, want: "jwt [redacted]"},
		"ordinary text survives": {in: "permission denied", want: "permission denied"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := newRedactor()
			r.add(tc.known...)
			if got := r.redact(tc.in); got != tc.want {
				t.Errorf("redact(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestRedactorForgetsOldestBeyondItsBound(t *testing.T) {
	r := newRedactor()
	for i := range maxRememberedSecrets + 1 {
		r.add(fmt.Sprintf("secret-%05d", i))
	}
	if got := r.redact("secret-00000 secret-00001"); got != "secret-00000 [redacted]" {
		t.Errorf("redact() = %q, want the oldest forgotten and the next remembered", got)
	}
	if len(r.known) != maxRememberedSecrets {
		t.Errorf("remembers %d values, want %d", len(r.known), maxRememberedSecrets)
	}
}
