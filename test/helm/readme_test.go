package helm

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/keyroll/keyroll/test/render"
)

// TestChartREADMEDocumentsEveryValue: the chart's README has a row for every value of values.yaml
// (a row may stand for a whole map, such as resources), and no row for a value that does not
// exist.
func TestChartREADMEDocumentsEveryValue(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(render.Chart(), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]any{}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(render.Chart(), "README.md"))
	if err != nil {
		t.Fatalf("the chart has no README: %v", err)
	}
	var rows []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|").FindAllStringSubmatch(string(readme), -1) {
		rows = append(rows, m[1])
	}
	if len(rows) == 0 {
		t.Fatal("the chart's README has no values table")
	}
	var paths []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		paths = append(paths, prefix)
		if m, ok := v.(map[string]any); ok {
			for k, e := range m {
				walk(prefix+"."+k, e)
			}
		}
	}
	for k, v := range values {
		walk(k, v)
	}
	covered := func(path string) bool {
		return slices.ContainsFunc(rows, func(r string) bool { return path == r || strings.HasPrefix(path, r+".") })
	}
	for _, p := range paths {
		m, isMap := lookup(values, p).(map[string]any)
		if (!isMap || len(m) == 0) && !covered(p) {
			t.Errorf("value %s is not in the chart's README", p)
		}
	}
	for _, r := range rows {
		if !slices.Contains(paths, r) {
			t.Errorf("the chart's README documents %s, which values.yaml does not have", r)
		}
	}
}

// lookup is the value at a dotted path of values.
func lookup(values map[string]any, path string) any {
	var v any = values
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}
