// Package docblocks finds the shell blocks of keyroll's docs and runs them, so that every command
// the docs show is run by a test and the docs cannot go stale.
//
// A shell block is a fenced block whose info string is "sh TAG": the tag says which test runs it
// (see Tags). A fenced block in another language holds no command to run (YAML, HCL, output).
package docblocks

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// Tags are the tags a shell block may carry, each with the test that runs its blocks.
var Tags = map[string]string{
	"two-commands":     "test/docs TestTheTwoCommandsAreWhatCIAndThePlaygroundTestRun (make test is .ci/run; make playground is run by test/playground)",
	"install":          "test/docs TestInstallAndVaultAdministratorCommands",
	"helm-install":     "test/helm TestHelmInstallCommands",
	"vault-setup":      "test/docs TestInstallAndVaultAdministratorCommands",
	"vault-tenancy":    "test/docs TestInstallAndVaultAdministratorCommands",
	"vault-plugin":     "test/dataplane TestVaultRevokeCutsTheCredentialOffEverywhere",
	"vault-plugin-tls": "test/dataplane TestVaultPluginOverTLS",
	"tour":             "test/playground TestPlaygroundRunsTheSamplesAndCleansUp",
	"watch":            "test/playground TestPlaygroundRunsTheSamplesAndCleansUp (each line runs until a timeout, and must print)",
	"dev":              "test/docs TestDevelopmentCommands",
	"needs-docker":     "not run: no Docker engine or image registry is reachable where the tests run",
}

// Block is one shell block of a doc.
type Block struct {
	File string // relative to the repository root
	Line int    // of the opening fence
	Tag  string
	Name string // the word after the tag, if any
	Text string
}

func (b Block) String() string {
	return fmt.Sprintf("%s:%d (%s)", b.File, b.Line, strings.TrimSpace("sh "+b.Tag+" "+b.Name))
}

// Docs lists keyroll's docs: README.md, docs/*.md and the READMEs under deploy/.
func Docs(root string) ([]string, error) {
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	err = filepath.WalkDir(filepath.Join(root, "deploy"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "README.md" {
			more = append(more, p)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, f := range more {
		rel, _ := filepath.Rel(root, f)
		files = append(files, rel)
	}
	sort.Strings(files[1:])
	return files, nil
}

// Extract returns every shell block of the docs, in order, and the fences of other blocks that
// look like shell ("```", "```bash", "```console", "```shell"), which are not allowed.
func Extract(root string) (blocks []Block, untagged []string, err error) {
	files, err := Docs(root)
	if err != nil {
		return nil, nil, err
	}
	for _, f := range files {
		fb, fu, err := extractFile(root, f)
		if err != nil {
			return nil, nil, err
		}
		blocks, untagged = append(blocks, fb...), append(untagged, fu...)
	}
	return blocks, untagged, nil
}

func extractFile(root, file string) (blocks []Block, untagged []string, err error) {
	f, err := os.Open(filepath.Join(root, file))
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var cur *Block
	var fence, indent string
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		trimmed := strings.TrimSpace(text)
		if cur == nil && fence == "" && strings.HasPrefix(trimmed, "```") {
			fence, indent = "```", text[:strings.Index(text, "```")]
			info := strings.Fields(strings.TrimPrefix(trimmed, "```"))
			switch {
			case len(info) == 0 || info[0] == "bash" || info[0] == "console" || info[0] == "shell" || (info[0] == "sh" && len(info) < 2):
				untagged = append(untagged, fmt.Sprintf("%s:%d", file, line))
			case info[0] == "sh":
				cur = &Block{File: file, Line: line, Tag: info[1]}
				if len(info) > 2 {
					cur.Name = info[2]
				}
			}
			continue
		}
		if fence != "" && trimmed == fence {
			if cur != nil {
				blocks = append(blocks, *cur)
			}
			cur, fence = nil, ""
			continue
		}
		if cur != nil {
			// A block inside a list item is indented as its fence is.
			cur.Text += strings.TrimPrefix(text, indent) + "\n"
		}
	}
	return blocks, untagged, sc.Err()
}

// Tagged returns the blocks with a tag, in doc order; it fails the test when there is none.
func Tagged(t testing.TB, root, tag string) []Block {
	t.Helper()
	blocks, _, err := Extract(root)
	if err != nil {
		t.Fatal(err)
	}
	var out []Block
	for _, b := range blocks {
		if b.Tag == tag {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no shell block tagged %q in the docs", tag)
	}
	return out
}

// Run runs a block as a bash script (errexit, nounset, pipefail) in dir with env added to this
// process's environment, and returns what it printed. A failing block fails the test.
func Run(t testing.TB, b Block, dir string, env []string, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.Text)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s failed: %v\n--- block ---\n%s--- output ---\n%s", b, err, b.Text, out)
	}
	t.Logf("%s ran:\n%s", b, out)
	return string(out)
}

// RunWatch runs each line of a block that keeps running (a watch) for a while, and requires that
// it printed something and had not failed when it was stopped.
func RunWatch(t testing.TB, b Block, dir string, env []string, d time.Duration) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(b.Text), "\n") {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", line)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		cancel()
		if ctx.Err() == nil {
			t.Fatalf("%s: %q ended (%v) instead of watching:\n%s", b, line, err, out)
		}
		if len(strings.TrimSpace(string(out))) == 0 {
			t.Fatalf("%s: %q printed nothing in %s", b, line, d)
		}
		t.Logf("%s: %q printed:\n%s", b, line, out)
	}
}
