package controllers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/keyroll/keyroll/"

// allowed lists, for each package of ours, the packages of ours it may import: imports go one way,
// from the wiring down to the API types. This is the only written layout of the packages: what
// each is for is its package comment, and `make layout` prints both as a table.
var allowed = map[string][]string{
	"apis/v1beta1":           {},
	"apis/v1alpha1":          {"apis/v1beta1"},
	"apis/externalsecrets":   {},
	"rotation":               {},
	"vault":                  {},
	"redisnode":              {},
	"certs":                  {},
	"controllers/stoppoint":  {},
	"controllers/status":     {},
	"controllers/metrics":    {},
	"controllers/upkeep":     {},
	"controllers/apply":      {"apis/v1beta1"},
	"controllers/render":     {"apis/externalsecrets", "apis/v1beta1"},
	"controllers/conversion": {"apis/v1beta1", "certs"},
	"controllers/connection": {"apis/v1beta1", "vault"},
	"controllers/credential": {"apis/externalsecrets", "apis/v1beta1", "controllers/apply", "controllers/connection", "controllers/metrics",
		"controllers/render", "controllers/status", "controllers/stoppoint", "rotation", "vault"},
	"controllers/vaultconnection": {"apis/v1beta1", "controllers/apply", "controllers/connection", "controllers/metrics",
		"controllers/status", "vault"},
	"controllers/rediscluster": {"apis/externalsecrets", "apis/v1beta1", "certs", "controllers/apply", "controllers/connection", "controllers/credential",
		"controllers/metrics", "controllers/render", "controllers/status", "controllers/stoppoint", "controllers/upkeep", "redisnode", "rotation", "vault"},
	"controllers": {"apis/externalsecrets", "apis/v1beta1", "controllers/apply", "controllers/connection", "controllers/metrics", "controllers/rediscluster",
		"controllers/vaultconnection", "vault"},
}

type listed struct {
	ImportPath string
	Doc        string
	Dir        string
	GoFiles    []string
	Imports    []string
}

// TestImportsGoOneWay: no package imports one of ours that it should not (no cycles, no reaching
// up), and vault/ and rotation/ import neither controller-runtime nor our API types.
func TestImportsGoOneWay(t *testing.T) {
	for _, p := range goList(t) {
		name := strings.TrimPrefix(p.ImportPath, module)
		want, ok := allowed[name]
		if !ok {
			t.Errorf("package %s is not in the layout (add it to allowed and to docs/development.md)", name)
			continue
		}
		for _, imp := range p.Imports {
			if (name == "vault" || name == "redisnode" || name == "rotation" || name == "apis/v1alpha1" || name == "apis/v1beta1") && strings.HasPrefix(imp, "sigs.k8s.io/controller-runtime/pkg/client") {
				t.Errorf("%s imports %s: it takes and returns plain values", name, imp)
			}
			if !strings.HasPrefix(imp, module) {
				continue
			}
			if dep := strings.TrimPrefix(imp, module); !slices.Contains(want, dep) {
				t.Errorf("%s imports %s, which it may not", name, dep)
			}
		}
	}
}

// TestFilesStaySmall: no file of ours over about four hundred lines (tests, generated code and
// API types excepted). Packages have no size limit: a controller's phases live together, as
// files of its package.
func TestFilesStaySmall(t *testing.T) {
	for _, p := range goList(t) {
		for _, f := range p.GoFiles {
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(b, []byte("\n")); n > 400 && f != "zz_generated.deepcopy.go" && !strings.HasSuffix(f, "_types.go") {
				t.Errorf("%s/%s has %d lines: is it one job?", strings.TrimPrefix(p.ImportPath, module), f, n)
			}
		}
	}
}

// TestEveryPackageSaysWhatItIsFor: each package of the layout has a package comment. Run with -v
// (make layout), it prints the layout: each package, what it is for, and what of ours it may import.
func TestEveryPackageSaysWhatItIsFor(t *testing.T) {
	pkgs := goList(t)
	if testing.Verbose() {
		fmt.Println("| package | what it is for | may import (of ours) |")
		fmt.Println("|---|---|---|")
	}
	for _, p := range pkgs {
		name := strings.TrimPrefix(p.ImportPath, module)
		if p.Doc == "" {
			t.Errorf("package %s has no package comment saying what it is for", name)
		}
		if testing.Verbose() {
			may := make([]string, 0, len(allowed[name]))
			for _, a := range allowed[name] {
				may = append(may, "`"+a+"`")
			}
			fmt.Printf("| `%s` | %s | %s |\n", name, p.Doc, strings.Join(may, ", "))
		}
	}
}

func goList(t *testing.T) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "../apis/...", "../rotation/...", "../vault", "../redisnode", "../certs", "./...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	return pkgs
}

// reconcilers are the packages of the two controllers: neither imports the other (what both need
// of connections is in controllers/connection).
var reconcilers = []string{"controllers/rediscluster", "controllers/vaultconnection"}

// TestNoControllerImportsAnother: the layout lets no reconciler package import another, so
// TestImportsGoOneWay holds them apart.
func TestNoControllerImportsAnother(t *testing.T) {
	for _, r := range reconcilers {
		for _, other := range reconcilers {
			if r != other && slices.Contains(allowed[r], other) {
				t.Errorf("%s may import %s: what both need belongs below them", r, other)
			}
		}
	}
}
