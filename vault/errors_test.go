package vault

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"syscall"
	"testing"

	vaultapi "github.com/hashicorp/vault/api"
)

func responseError(code int, msgs ...string) error {
	return &vaultapi.ResponseError{HTTPMethod: "PUT", URL: "http://vault/v1/x", StatusCode: code, Errors: msgs}
}

func TestClassify(t *testing.T) {
	refused := &url.Error{Op: "Put", URL: "http://127.0.0.1:1/v1/x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	cases := map[string]struct {
		err         error
		want        string
		unavailable bool
	}{
		"nil":                 {err: nil, want: ""},
		"403":                 {err: responseError(403, "permission denied"), want: ClassPermissionDenied},
		"403 invalid token":   {err: responseError(403, "permission denied", "invalid token"), want: ClassPermissionDenied},
		"404":                 {err: responseError(404), want: ClassNotFound},
		"400":                 {err: responseError(400, "missing client token"), want: ClassBadRequest},
		"400 invalid lease":   {err: responseError(400, "invalid lease"), want: ClassLeaseGone},
		"400 lease not found": {err: responseError(400, "lease not found"), want: ClassLeaseGone},
		"400 lease expired":   {err: responseError(400, "lease expired"), want: ClassLeaseGone},
		"400 not renewable":   {err: responseError(400, "lease is not renewable"), want: ClassBadRequest},
		"429":                 {err: responseError(429), want: ClassUnavailable, unavailable: true},
		"500":                 {err: responseError(500), want: ClassUnavailable, unavailable: true},
		"503 sealed":          {err: responseError(503, "Vault is sealed"), want: ClassSealed, unavailable: true},
		"503 other":           {err: responseError(503, "standby"), want: ClassUnavailable, unavailable: true},
		"connection refused":  {err: refused, want: ClassUnavailable, unavailable: true},
		"connection reset":    {err: fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), want: ClassUnavailable, unavailable: true},
		"deadline":            {err: fmt.Errorf("put: %w", context.DeadlineExceeded), want: ClassUnavailable, unavailable: true},
		"canceled":            {err: context.Canceled, want: ClassCanceled},
		"unknown authority":   {err: &url.Error{Op: "Get", URL: "https://v", Err: x509.UnknownAuthorityError{}}, want: ClassInvalidConfig},
		"something else":      {err: errors.New("boom"), want: ClassUnknown},
		"wrapped vault error": {err: fmt.Errorf("renewing: %w", &Error{Class: ClassSealed}), want: ClassSealed, unavailable: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := ClassOf(tc.err); got != tc.want {
				t.Errorf("ClassOf() = %q, want %q", got, tc.want)
			}
			if got := IsUnavailable(tc.err); got != tc.unavailable {
				t.Errorf("IsUnavailable() = %v, want %v", got, tc.unavailable)
			}
		})
	}
}

func TestErrorMessages(t *testing.T) {
	r := newRedactor()
	r.add("s3cret-token")
	cases := map[string]struct {
		err  *Error
		want string
	}{
		"vault refusal": {err: func() *Error {
			e := newError(opIssue, "database/creds/orders", responseError(403, "permission denied"), r)
			e.Attempts = 1
			return e
		}(), want: "vault issue database/creds/orders: permission denied (HTTP 403): permission denied"},
		"made again after a new login": {err: func() *Error {
			e := newError(opRenew, "database/creds/orders/abc", responseError(503, "Vault is sealed"), r)
			e.Attempts = 2
			return e
		}(), want: "vault renew database/creds/orders/abc: vault is sealed (HTTP 503, 2 attempts): Vault is sealed"},
		"secret in vault's message": {err: newError(opLogin, "auth/approle/login", responseError(400, "bad token s3cret-token"), r),
			want: "vault login auth/approle/login: bad request (HTTP 400): bad token [redacted]"},
		"body not json": {err: newError(opIssue, "p", &vaultapi.ResponseError{StatusCode: 502, RawError: true, Errors: []string{"<html>s3cret-token</html>"}}, r),
			want: "vault issue p: vault unavailable (HTTP 502): the response body is not a Vault error document"},
		"body not the json expected": {err: newError(opRenew, "l", func() error {
			var v map[string]any
			return json.Unmarshal([]byte("{s3cret-token"), &v)
		}(), r), want: "vault renew l: failed: the response is not a Vault secret document"},
		"many messages": {err: newError(opIssue, "p", responseError(400, "1", "2", "3", "4", "5", "6", "7"), r),
			want: "vault issue p: bad request (HTTP 400): 1; 2; 3; 4; 5; and 2 more"},
		"network": {err: newError(opHealth, "sys/health", &url.Error{Op: "Get", URL: "http://127.0.0.1:1/v1/sys/health", Err: errors.New("connection refused")}, r),
			want: `vault health sys/health: vault unavailable: Get "http://127.0.0.1:1/v1/sys/health": connection refused`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestErrorUnwrapsOnlyContextErrors(t *testing.T) {
	r := newRedactor()
	deadline := newError(opIssue, "p", fmt.Errorf("put: %w", context.DeadlineExceeded), r)
	if !errors.Is(deadline, context.DeadlineExceeded) {
		t.Errorf("a deadline error does not unwrap to context.DeadlineExceeded")
	}
	refusal := newError(opIssue, "p", responseError(403, "permission denied"), r)
	if errors.Unwrap(refusal) != nil {
		t.Errorf("a Vault refusal unwraps to %v, which may quote a response", errors.Unwrap(refusal))
	}
	var re *vaultapi.ResponseError
	if errors.As(fmt.Errorf("x: %w", refusal), &re) {
		t.Errorf("the raw ResponseError is reachable")
	}
}
