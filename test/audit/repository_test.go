package audit

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/keyroll/keyroll/test/testground"
)

// maxTrackedFile is the largest file the repository may track: every clone downloads every
// version of every tracked file, and nothing keyroll writes by hand or generates comes near it
// (the largest, the CRDs of deploy/crd and their copies in the chart and bundle/, are under
// 512 KiB). A file past it is a build output or data committed by accident.
const maxTrackedFile = 2 << 20

// binaryMagic are the first bytes of compiled programs and object archives of the platforms Go
// builds for: ELF, Mach-O (32 and 64 bit, both byte orders, and universal), PE (MZ) and ar.
var binaryMagic = [][]byte{
	[]byte("\x7fELF"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf}, {0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
	[]byte("MZ"),
	[]byte("!<arch>\n"),
}

// compiled says whether head, a file's first bytes, begins like a compiled program.
func compiled(head []byte) bool {
	for _, m := range binaryMagic {
		if bytes.HasPrefix(head, m) {
			return true
		}
	}
	return false
}

// TestRepositoryTracksNoBinaryOrLargeFile: no file Git tracks is over 2 MiB or a compiled
// program (a `go build` at the root writes ./keyroll; .gitignore keeps such outputs out).
func TestRepositoryTracksNoBinaryOrLargeFile(t *testing.T) {
	root := testground.RepoRoot()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := bytes.Split(bytes.TrimSuffix(out, []byte{0}), []byte{0})
	if len(files) < 100 {
		t.Fatalf("git ls-files listed %d files: not the repository", len(files))
	}
	for _, f := range files {
		name := string(f)
		path := filepath.Join(root, name)
		info, err := os.Lstat(path)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or a symbolic link
		}
		if info.Size() > maxTrackedFile {
			t.Errorf("%s is tracked and %d bytes, over %d: build outputs and data do not belong in the repository", name, info.Size(), maxTrackedFile)
		}
		fh, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 8)
		n, _ := io.ReadFull(fh, head)
		_ = fh.Close()
		if compiled(head[:n]) {
			t.Errorf("%s is tracked and a compiled program: build outputs do not belong in the repository", name)
		}
	}
}

// TestCompiledProgramsAreRecognised: the check above knows a Go binary when it sees one (this
// test's own), and takes none of the repository's kinds of text for one.
func TestCompiledProgramsAreRecognised(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 8)
	fh, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := io.ReadFull(fh, head); err != nil {
		t.Fatal(err)
	}
	if !compiled(head) {
		t.Errorf("the test binary %s (%q) is not recognised as compiled", self, head)
	}
	for _, text := range []string{"package main\n", "# keyroll\n", "apiVersion: v1\n", "{\"a\":1}", "\x89PNG\r\n\x1a\n"} {
		if compiled([]byte(text)) {
			t.Errorf("%q taken for a compiled program", text)
		}
	}
}
