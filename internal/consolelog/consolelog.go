// Package consolelog keeps console log lines short enough to read in a terminal: of the context
// fields controller-runtime adds to every reconcile's logger (controller, controllerGroup,
// controllerKind, the object under its kind, namespace, name, reconcileID) it keeps only the
// object, as one "object": "namespace/name" field. JSON logs keep every field; this wraps only the
// core of a console logger.
package consolelog

import (
	"go.uber.org/zap/zapcore"
)

// Short wraps a zap core so that the reconcile context fields collapse into "object".
func Short(core zapcore.Core) zapcore.Core { return &shortCore{Core: core} }

type shortCore struct {
	zapcore.Core
	kind string // the controllerKind seen so far: the object's own field has it as key
}

// With drops the context fields controller-runtime adds and keeps the others.
func (c *shortCore) With(fields []zapcore.Field) zapcore.Core {
	n := &shortCore{kind: c.kind}
	var kept []zapcore.Field
	var namespace, name string
	for _, f := range fields {
		switch {
		case f.Key == "controller" || f.Key == "controllerGroup" || f.Key == "reconcileID":
		case f.Key == "controllerKind":
			n.kind = f.String
		case f.Key == "namespace" && f.Type == zapcore.StringType:
			namespace = f.String
		case f.Key == "name" && f.Type == zapcore.StringType:
			name = f.String
		case n.kind != "" && f.Key == n.kind:
		default:
			kept = append(kept, f)
		}
	}
	if name != "" {
		object := name
		if namespace != "" {
			object = namespace + "/" + name
		}
		kept = append(kept, zapcore.Field{Key: "object", Type: zapcore.StringType, String: object})
	}
	n.Core = c.Core.With(kept)
	return n
}
