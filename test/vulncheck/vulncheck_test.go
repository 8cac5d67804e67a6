// Package vulncheck runs govulncheck on keyroll's code, with Go's vulnerability database indexed
// from the golang.org/x/vulndb module (both built by test/tools): any vulnerability that the code
// reaches fails the suite, with a fixed version or not, unless accepted.yaml says why it cannot
// be fixed here (it lists none).
package vulncheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/test/testground"
)

// accepted is an entry of accepted.yaml.
type accepted struct {
	ID     string `json:"id"`
	Module string `json:"module"`
	Why    string `json:"why"`
}

// finding is govulncheck's JSON finding: the advisory, its fixed version, and the trace from the
// vulnerable symbol (first) to keyroll's code; a trace whose first frame names a function is
// reachable from the code.
type finding struct {
	OSV          string `json:"osv"`
	FixedVersion string `json:"fixed_version"`
	Trace        []struct {
		Module   string `json:"module"`
		Version  string `json:"version"`
		Package  string `json:"package"`
		Function string `json:"function"`
		Receiver string `json:"receiver"`
	} `json:"trace"`
}

func TestNoReachableVulnerability(t *testing.T) {
	bin, err := testground.Binary("govulncheck")
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(testground.BinDir(), "vulndb")
	if _, err := os.Stat(filepath.Join(db, "index", "db.json")); err != nil {
		t.Fatalf("Go's vulnerability database is not in %s: run `make testground` (test/tools/build.sh): %v", db, err)
	}
	b, err := os.ReadFile("accepted.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var allowed []accepted
	if err := yaml.Unmarshal(b, &allowed); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "file://"+db, "-json", "./...")
	cmd.Dir = testground.RepoRoot()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("govulncheck: %v\n%s", err, stderr.String())
	}
	var goVersion string
	reached := map[string]finding{} // by advisory
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var msg struct {
			Config *struct {
				GoVersion string `json:"go_version"`
			} `json:"config"`
			Finding *finding `json:"finding"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("reading govulncheck's output: %v", err)
		}
		if msg.Config != nil {
			goVersion = msg.Config.GoVersion
		}
		if f := msg.Finding; f != nil && len(f.Trace) > 0 && f.Trace[0].Function != "" {
			reached[f.OSV] = *f
		}
	}
	t.Logf("govulncheck scanned with %s: %d advisories reachable", goVersion, len(reached))
	for id, f := range reached {
		at := f.Trace[0]
		if i := slices.IndexFunc(allowed, func(a accepted) bool { return a.ID == id && a.Module == at.Module }); i >= 0 {
			t.Logf("accepted: %s in %s@%s (fixed in %s): %s", id, at.Module, at.Version, f.FixedVersion, strings.TrimSpace(allowed[i].Why))
			continue
		}
		where := at.Package + "." + at.Function
		if at.Receiver != "" {
			where = at.Package + "." + at.Receiver + "." + at.Function
		}
		mod := at.Module
		if at.Version != "" {
			mod += "@" + at.Version
		}
		fix := "has no fixed version yet"
		if f.FixedVersion != "" {
			fix = "is fixed in " + f.FixedVersion
		}
		t.Errorf("%s: %s, reachable at %s, %s", id, mod, where, fix)
	}
	for _, a := range allowed {
		if _, ok := reached[a.ID]; !ok {
			t.Errorf("accepted.yaml lists %s (%s), which govulncheck no longer finds reachable: remove it", a.ID, a.Module)
		}
	}
}
