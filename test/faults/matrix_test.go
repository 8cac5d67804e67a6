package faults

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/keyroll/keyroll/test/framework"
)

// The markers between which docs/reliability.md holds the matrix of the last run.
const (
	matrixBegin = "<!-- fault-matrix:begin (written by make reliability) -->"
	matrixEnd   = "<!-- fault-matrix:end -->"
)

// row is one fault of the matrix, what must happen, and what the run measured.
type row struct {
	order           int
	fault, expected string
	test, measured  string
	passed          bool
}

// faultMatrix collects the rows' outcomes as the tests run.
type faultMatrix struct {
	mu    sync.Mutex
	rows  []*row
	notes []string
}

var matrix = &faultMatrix{}

// record adds a row's outcome.
func (m *faultMatrix) record(r *row) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows = append(m.rows, r)
}

// note adds a line printed below the table.
func (m *faultMatrix) note(s string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.notes = append(m.notes, s)
}

// markdown is the matrix as a Markdown table, in the rows' order.
func (m *faultMatrix) markdown() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	rows := append([]*row(nil), m.rows...)
	for i := range rows { // insertion sort by order: a dozen rows
		for j := i; j > 0 && rows[j].order < rows[j-1].order; j-- {
			rows[j], rows[j-1] = rows[j-1], rows[j]
		}
	}
	var b strings.Builder
	b.WriteString("| fault | expected | measured | test |\n|---|---|---|---|\n")
	for _, r := range rows {
		outcome := "**failed**: "
		if r.passed {
			outcome = ""
		}
		fmt.Fprintf(&b, "| %s | %s | %s%s | `%s` |\n", r.fault, r.expected, outcome, r.measured, r.test)
	}
	for _, n := range m.notes {
		b.WriteString("\n" + n + "\n")
	}
	return b.String()
}

// writeInto replaces the matrix between the markers of doc.
func (m *faultMatrix) writeInto(doc string) error {
	return framework.WriteSection(doc, matrixBegin, matrixEnd, m.markdown())
}

// newRow starts a row of the matrix for test t; the row's outcome is recorded when t ends.
func newRow(t *testing.T, order int, fault, expected string) *row {
	r := &row{order: order, fault: fault, expected: expected, test: t.Name()}
	t.Cleanup(func() {
		r.passed = !t.Failed()
		if r.measured == "" {
			r.measured = "did not finish"
		}
		matrix.record(r)
	})
	return r
}
