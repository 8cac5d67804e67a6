package vault

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	vaultapi "github.com/hashicorp/vault/api"
)

// Error classes, as returned by ClassOf and passed to Config.Observer.
const (
	// ClassPermissionDenied: Vault answered 403 (a policy forbids the path, or the login was refused).
	ClassPermissionDenied = "PermissionDenied"
	// ClassNotFound: Vault answered 404, or the path holds nothing.
	ClassNotFound = "NotFound"
	// ClassLeaseGone: the lease does not exist (any more): revoked, expired or never issued.
	ClassLeaseGone = "LeaseGone"
	// ClassBadRequest: Vault refused the request (400 or another 4xx that retrying cannot fix).
	ClassBadRequest = "BadRequest"
	// ClassSealed: Vault is sealed.
	ClassSealed = "Sealed"
	// ClassUnavailable: Vault could not be reached or answered with a transient failure (5xx, 429,
	// standby), or the deadline passed.
	ClassUnavailable = "Unavailable"
	// ClassCanceled: the caller canceled the context.
	ClassCanceled = "Canceled"
	// ClassInvalidConfig: the settings cannot work (bad address, CA bundle, auth settings, or a
	// server certificate that does not verify against them).
	ClassInvalidConfig = "InvalidConfig"
	// ClassUnknown: anything else, for example a response the client cannot understand.
	ClassUnknown = "Unknown"
	// ClassRefused: keyroll refused the request itself, before sending it: the path or lease lies
	// outside what the RedisCluster's namespace may use (Refused).
	ClassRefused = "Refused"

	// OutcomeSuccess is the outcome passed to Config.Observer for a successful request.
	OutcomeSuccess = "Success"
)

// Operations, as they appear in errors, logs and Config.Observer.
const (
	opConfigure  = "configure"
	opIssue      = "issue"
	opRenew      = "renew"
	opRevoke     = "revoke"
	opLookup     = "lookup"
	opListLeases = "list-leases"
	opHealth     = "health"
	opLogin      = "login"
	opRenewSelf  = "renew-self"
	opLookupSelf = "lookup-self"
)

const (
	maxMessages      = 5
	maxMessageLength = 300
)

// Error is a failed Vault operation. Its message is built from the operation, the path, the HTTP
// status and Vault's error strings with every known secret removed; it never holds a response body.
type Error struct {
	// Op is the operation: "issue", "renew", "revoke", "lookup", "health", "login", ...
	Op string
	// Path is the Vault path, or the lease ID for lease operations.
	Path string
	// Class is one of the Class constants.
	Class string
	// StatusCode is the HTTP status Vault answered with, 0 if there was no answer.
	StatusCode int
	// Attempts is the number of requests the operation made: 1, or 2 when Vault called the token
	// invalid and the request was made again after a new login. Nothing else is retried.
	Attempts int
	// Messages are Vault's error strings, with secrets removed.
	Messages []string

	detail string // a description of a failure without an HTTP answer, secrets removed
	cause  error  // only errors that are safe to expose: context errors, the caller's own errors
}

// Error describes the failure without any secret.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("vault " + e.Op)
	if e.Path != "" {
		b.WriteString(" " + e.Path)
	}
	b.WriteString(": " + describeClass(e.Class))
	var facts []string
	if e.StatusCode != 0 {
		facts = append(facts, fmt.Sprintf("HTTP %d", e.StatusCode))
	}
	if e.Attempts > 1 {
		facts = append(facts, fmt.Sprintf("%d attempts", e.Attempts))
	}
	if len(facts) > 0 {
		b.WriteString(" (" + strings.Join(facts, ", ") + ")")
	}
	if len(e.Messages) > 0 {
		b.WriteString(": " + strings.Join(e.Messages, "; "))
	}
	if e.detail != "" {
		b.WriteString(": " + e.detail)
	}
	return b.String()
}

// Unwrap exposes context errors (errors.Is(err, context.DeadlineExceeded)) and errors of the
// caller's own token source; never an error that may quote a Vault response.
func (e *Error) Unwrap() error { return e.cause }

func describeClass(class string) string {
	switch class {
	case ClassPermissionDenied:
		return "permission denied"
	case ClassNotFound:
		return "not found"
	case ClassLeaseGone:
		return "lease not found"
	case ClassBadRequest:
		return "bad request"
	case ClassSealed:
		return "vault is sealed"
	case ClassUnavailable:
		return "vault unavailable"
	case ClassCanceled:
		return "canceled"
	case ClassInvalidConfig:
		return "invalid configuration"
	case ClassRefused:
		return "refused by keyroll, not sent to Vault"
	}
	return "failed"
}

// ClassOf returns the class of err (one of the Class constants), or "" for nil.
func ClassOf(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return classify(err)
}

// Refused is the error of an operation (op: "issue", "renew", "revoke", "lookup", "list-leases")
// that keyroll refuses to send to Vault at all; why says which rule refuses it.
func Refused(op, path, why string) error {
	return &Error{Op: op, Path: path, Class: ClassRefused, detail: why}
}

// IsRefused says that keyroll refused the operation without sending it to Vault.
func IsRefused(err error) bool { return ClassOf(err) == ClassRefused }

// IsPermissionDenied reports whether Vault refused the request or the login (403).
func IsPermissionDenied(err error) bool { return ClassOf(err) == ClassPermissionDenied }

// IsNotFound reports whether the path does not exist or holds nothing (404).
func IsNotFound(err error) bool { return ClassOf(err) == ClassNotFound }

// IsLeaseGone reports whether the lease does not exist any more (revoked, expired).
func IsLeaseGone(err error) bool { return ClassOf(err) == ClassLeaseGone }

// IsBadRequest reports whether Vault refused the request as invalid (400 and similar).
func IsBadRequest(err error) bool { return ClassOf(err) == ClassBadRequest }

// IsSealed reports whether Vault was sealed.
func IsSealed(err error) bool { return ClassOf(err) == ClassSealed }

// IsUnavailable reports whether Vault could not serve the request for a transient reason
// (unreachable, sealed, standby, 5xx, 429, deadline): trying again later may work.
func IsUnavailable(err error) bool {
	c := ClassOf(err)
	return c == ClassUnavailable || c == ClassSealed
}

// IsInvalidConfig reports whether the connection settings cannot work.
func IsInvalidConfig(err error) bool { return ClassOf(err) == ClassInvalidConfig }

// IsLoginFailed reports whether err comes from logging in (or looking up a static token).
func IsLoginFailed(err error) bool {
	var e *Error
	return errors.As(err, &e) && (e.Op == opLogin || e.Op == opLookupSelf)
}

// classify maps an error from the Vault API client (or the network) to a class.
func classify(err error) string {
	var re *vaultapi.ResponseError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.Canceled):
		return ClassCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, new(notTried)):
		return ClassUnavailable
	case errors.As(err, &re):
		return classifyStatus(re.StatusCode, re.Errors)
	case isTLSVerification(err):
		return ClassInvalidConfig
	case isNetwork(err):
		return ClassUnavailable
	}
	return ClassUnknown
}

func classifyStatus(code int, messages []string) string {
	switch {
	case code == http.StatusForbidden:
		return ClassPermissionDenied
	case code == http.StatusNotFound:
		return ClassNotFound
	case code == http.StatusServiceUnavailable && containsAny(messages, "sealed"):
		return ClassSealed
	case code == http.StatusBadRequest && containsAny(messages, "invalid lease", "lease not found", "lease expired"):
		return ClassLeaseGone
	case code == http.StatusTooManyRequests, code == http.StatusPreconditionFailed, code >= 500:
		return ClassUnavailable
	case code >= 400:
		return ClassBadRequest
	}
	return ClassUnknown
}

func containsAny(messages []string, needles ...string) bool {
	for _, m := range messages {
		m = strings.ToLower(m)
		for _, n := range needles {
			if strings.Contains(m, n) {
				return true
			}
		}
	}
	return false
}

// invalidToken reports whether Vault refused the token itself (expired or revoked), rather
// than what it asked for.
func invalidToken(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.StatusCode == http.StatusForbidden && containsAny(e.Messages, "invalid token")
}

func isTLSVerification(err error) bool {
	var (
		verr *tls.CertificateVerificationError
		uerr x509.UnknownAuthorityError
		herr x509.HostnameError
		cerr x509.CertificateInvalidError
	)
	return errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &cerr)
}

// isDecodeError reports whether a response body could not be decoded as the JSON expected: the
// decoder's message may quote a piece of it.
func isDecodeError(err error) bool {
	var (
		serr *json.SyntaxError
		terr *json.UnmarshalTypeError
	)
	return errors.As(err, &serr) || errors.As(err, &terr)
}

func isNetwork(err error) bool {
	var nerr net.Error
	return errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed)
}

// newError describes a failed request: status and Vault's error strings (redacted) for an HTTP
// answer, the redacted error text otherwise. A response body that Vault did not send as an error
// document, or that is not the JSON expected, is never quoted.
func newError(op, path string, err error, r *redactor) *Error {
	e := &Error{Op: op, Path: path, Class: classify(err)}
	var re *vaultapi.ResponseError
	switch {
	case errors.As(err, &re):
		e.StatusCode = re.StatusCode
		if re.RawError {
			e.detail = "the response body is not a Vault error document"
		} else {
			e.Messages = redactMessages(re.Errors, r)
		}
	case isDecodeError(err):
		e.detail = "the response is not a Vault secret document"
	default:
		e.detail = r.redact(err.Error())
	}
	switch {
	case errors.Is(err, context.Canceled):
		e.cause = context.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		e.cause = context.DeadlineExceeded
	}
	return e
}

func redactMessages(msgs []string, r *redactor) []string {
	out := make([]string, 0, min(len(msgs), maxMessages))
	for i, m := range msgs {
		if i == maxMessages {
			out = append(out, fmt.Sprintf("and %d more", len(msgs)-maxMessages))
			break
		}
		m = strings.TrimSpace(r.redact(m))
		if len(m) > maxMessageLength {
			m = m[:maxMessageLength] + "..."
		}
		out = append(out, m)
	}
	return out
}
