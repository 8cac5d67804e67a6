package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// WriteSection replaces what doc holds between the lines begin and end (HTML comments, so that
// the Markdown shows nothing of them) with text: the measured figures a make target writes into
// the docs.
func WriteSection(doc, begin, end, text string) error {
	return editSection(doc, begin, end, func(string) string { return "\n\n" + strings.TrimRight(text, "\n") + "\n\n" })
}

// editSection replaces what doc holds between begin and end with what edit makes of it, with the
// docs locked (tests of several packages write at once).
func editSection(doc, begin, end string, edit func(body string) string) error {
	unlock, err := lockDocs()
	if err != nil {
		return err
	}
	defer unlock()
	b, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q ... %q markers", doc, begin, end)
	}
	i += len(begin)
	return os.WriteFile(doc, []byte(s[:i]+edit(s[i:j])+s[j:]), 0o644)
}

// ReliabilityDocEnv names the reliability doc (docs/reliability.md) that make reliability has
// the tests write their measured outcomes into; unset, nothing is written.
const ReliabilityDocEnv = "KEYROLL_RELIABILITY_DOC"

// ReliabilityRow records t's row in a table of measured outcomes of the reliability doc, when
// ReliabilityDocEnv names it and t passed: the table between the markers "<!-- section:begin"
// and "<!-- section:end -->", whose rows end with the test's name in their last cell. t's row is
// replaced, or added at the table's end. measured is called when t ends, so that it says what t
// measured; tests of several packages may write at once (the doc is locked meanwhile).
func ReliabilityRow(t *testing.T, section, fault, expected string, measured func() string) {
	doc := os.Getenv(ReliabilityDocEnv)
	if doc == "" {
		return
	}
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		cell := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ") }
		row := fmt.Sprintf("| %s | %s | %s | `%s` |", cell(fault), cell(expected), cell(measured()), t.Name())
		if err := writeRow(doc, section, "| `"+t.Name()+"` |", row); err != nil {
			t.Errorf("writing the reliability row: %v", err)
		}
	})
}

// writeRow replaces the line that ends with key in doc's section, or adds row before the section's end.
func writeRow(doc, section, key, row string) error {
	return editSection(doc, "<!-- "+section+":begin", "<!-- "+section+":end -->", func(body string) string {
		lines := strings.Split(body, "\n")
		replaced := false
		for k, line := range lines {
			if strings.HasSuffix(strings.TrimSpace(line), key) {
				lines[k], replaced = row, true
			}
		}
		if body = strings.Join(lines, "\n"); !replaced {
			body = strings.TrimRight(body, "\n") + "\n" + row + "\n\n"
		}
		return body
	})
}

// lockDocs holds the lock that the tests of every package writing into the docs at once take
// in turn; the returned func releases it. The lock file is kept: removing it would let two
// writers lock two files.
func lockDocs() (func(), error) {
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "keyroll-docs.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return nil, err
	}
	return func() { lock.Close() }, nil
}
