package controllers

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestNoHelperDefinedTwice: no function body of more than one statement is written twice under
// controllers/, whatever the functions and their parameters and variables are called: a helper
// two packages need lives in the lower of them (or in status, render, nodes), and the other
// imports it.
func TestNoHelperDefinedTwice(t *testing.T) {
	bodies := map[string][]string{}
	fset := token.NewFileSet()
	for _, p := range goList(t) {
		if !strings.HasPrefix(p.ImportPath, module+"controllers") {
			continue
		}
		for _, f := range p.GoFiles {
			file, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Body == nil || len(fn.Body.List) < 2 {
					continue
				}
				renameLocals(fn)
				var b bytes.Buffer
				if err := printer.Fprint(&b, token.NewFileSet(), fn.Body); err != nil {
					t.Fatal(err)
				}
				where := strings.TrimPrefix(p.ImportPath, module) + "." + fn.Name.Name
				bodies[strings.Join(strings.Fields(b.String()), " ")] = append(bodies[strings.Join(strings.Fields(b.String()), " ")], where)
			}
		}
	}
	var twice []string
	for _, w := range bodies {
		if len(w) > 1 {
			twice = append(twice, strings.Join(w, " and "))
		}
	}
	sort.Strings(twice)
	for _, w := range twice {
		t.Errorf("the same function body twice: %s: keep one and call it", w)
	}
}

// renameLocals renames fn's parameters, results and the variables its body declares to v0, v1,
// ... in the order they are declared, so that two copies that differ only in those names print
// the same.
func renameLocals(fn *ast.FuncDecl) {
	names := map[string]string{}
	declare := func(id *ast.Ident) {
		if id.Name != "_" && names[id.Name] == "" {
			names[id.Name] = "v" + strconv.Itoa(len(names))
		}
	}
	for _, fl := range []*ast.FieldList{fn.Type.Params, fn.Type.Results} {
		if fl == nil {
			continue
		}
		for _, f := range fl.List {
			for _, id := range f.Names {
				declare(id)
			}
		}
	}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, e := range n.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						declare(id)
					}
				}
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				declare(id)
			}
		case *ast.RangeStmt:
			if n.Tok == token.DEFINE {
				for _, e := range []ast.Expr{n.Key, n.Value} {
					if id, ok := e.(*ast.Ident); ok {
						declare(id)
					}
				}
			}
		}
		return true
	})
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			ast.Inspect(sel.X, func(n ast.Node) bool { // the field or method name stays
				if id, ok := n.(*ast.Ident); ok && names[id.Name] != "" {
					id.Name = names[id.Name]
				}
				return true
			})
			return false
		}
		if id, ok := n.(*ast.Ident); ok && names[id.Name] != "" {
			id.Name = names[id.Name]
		}
		return true
	})
}
