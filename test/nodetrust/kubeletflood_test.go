package nodetrust

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/test/framework"
	"github.com/keyroll/keyroll/test/testground"
)

// floodSource is a second address of this machine on the node's bridge, for connections that
// must not come from the node's own address (the kubelet's): another pod, as the sidecar sees it.
// It lies below the pods' range (the CNI config's rangeStart, 10.212.0.10), so no pod has it.
const floodSource = "10.212.0.9"

// addBridgeAddress gives the node's bridge floodSource until the test ends.
func addBridgeAddress(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("ip", "addr", "add", floodSource+"/32", "dev", testground.NodeBridge).CombinedOutput(); err != nil {
		t.Fatalf("adding %s to %s: %v: %s", floodSource, testground.NodeBridge, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "addr", "del", floodSource+"/32", "dev", testground.NodeBridge).CombinedOutput(); err != nil {
			t.Errorf("removing %s from %s: %v: %s", floodSource, testground.NodeBridge, err, out)
		}
	})
}

// TestKubeletProbesAnsweredWhileAnotherSourceFloods: 400 idle connections to a healthy Redis
// pod's probe sidecar from another address than the node's, those it takes held open for 45 seconds (four
// readiness and liveness periods of the kubelet, which probes from the node's address): no probe
// of the kubelet fails meanwhile (no Unhealthy event for the pod), the pod stays Ready and no
// container restarts.
func TestKubeletProbesAnsweredWhileAnotherSourceFloods(t *testing.T) {
	ctx := context.Background()
	ns := fw.Namespace(t, "kubeletflood")
	vc := fw.VaultConnection(t, "vault-kubeletflood", framework.Allow(ns))
	rc := fw.RedisCluster(t, ns, "cache", vc.Name, fw.Path("orders"), framework.Replicas(1))
	fw.WaitReady(t, rc, 3*time.Minute)
	pod := fw.RedisPods(t, rc)[0]
	before := containers(&pod)
	addBridgeAddress(t)

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(floodSource)}, Timeout: 5 * time.Second}
	addr := net.JoinHostPort(pod.Status.PodIP, "8081")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	refused := 0
	for range 400 {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			refused++ // reset by the sidecar, over its connections from one address
			continue
		}
		conns = append(conns, c)
	}
	start := time.Now()
	t.Logf("400 connections from %s to %s: %d open, %d refused while connecting", floodSource, addr, len(conns), refused)
	time.Sleep(45 * time.Second)
	// How many the sidecar kept: a connection it refused reads EOF (or a reset) at once.
	kept := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && strings.Contains(err.Error(), "timeout") {
			kept++
		}
	}

	events := &corev1.EventList{}
	if err := fw.Client.List(ctx, events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var unhealthy []string
	for _, e := range events.Items {
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		if e.InvolvedObject.Name == pod.Name && e.Reason == "Unhealthy" && !at.Before(start.Add(-time.Second)) {
			unhealthy = append(unhealthy, fmt.Sprintf("%s (x%d)", e.Message, e.Count))
		}
	}
	after := fw.RedisPods(t, rc)[0]
	t.Logf("after 45 s: %d of the 400 connections still open; %d Unhealthy events; containers %s", kept, len(unhealthy), containers(&after))
	if len(unhealthy) > 0 {
		t.Errorf("the kubelet's probes failed while another address tried 400 connections: %v", unhealthy)
	}
	if got := containers(&after); got != before || !framework.PodReady(&after) || after.UID != pod.UID {
		t.Errorf("containers before the flood %s, after %s (Ready %v)", before, got, framework.PodReady(&after))
	}
}
