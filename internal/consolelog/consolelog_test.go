package consolelog

import (
	"bytes"
	"strings"
	"testing"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
)

// A reconcile's logger, built as controller-runtime builds it, writes one short console line: the
// message, the object as namespace/name, and the message's own fields; none of the eight context
// fields.
func TestShortDropsReconcileContext(t *testing.T) {
	var buf bytes.Buffer
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	core := zapcore.NewCore(enc, zapcore.AddSync(&buf), zapcore.DebugLevel)
	log := zapr.NewLogger(zap.New(Short(core))).
		WithValues("controller", "rediscluster", "controllerGroup", "keyroll.dev", "controllerKind", "RedisCluster").
		WithValues("RedisCluster", klog.KRef("default", "orders"), "namespace", "default", "name", "orders", "reconcileID", "0b1c")
	log.Info("Lease renewed", "leaseID", "database/creds/orders/abc", "name", "kept")
	line := buf.String()
	for _, gone := range []string{"controllerGroup", "controllerKind", `"controller"`, "reconcileID", `"RedisCluster"`, `"namespace"`} {
		if strings.Contains(line, gone) {
			t.Errorf("the console line still has %s: %s", gone, line)
		}
	}
	for _, want := range []string{"Lease renewed", `"object": "default/orders"`, `"leaseID": "database/creds/orders/abc"`, `"name": "kept"`} {
		if !strings.Contains(line, want) {
			t.Errorf("the console line lacks %s: %s", want, line)
		}
	}
}
