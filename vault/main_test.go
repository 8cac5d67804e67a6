package vault_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain stops the test ground the integration tests share (if one started), then fails the
// package's tests if any goroutine outlives them: the client starts none of its own, and the
// tests' helpers must stop theirs.
func TestMain(m *testing.M) {
	code := m.Run()
	stopSharedGround()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
