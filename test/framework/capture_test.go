package framework

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// These tests capture on loopback, which needs root like a capture on the node's bridge; they do not
// skip without it: StartCapture fails them, saying why.

func TestCaptureFindsANeedleSplitOverTwoSegments(t *testing.T) {
	checkNoGoroutineLeft(t)
	captured, other := startSink(t), startSink(t)
	wasPromiscuous := promiscuous(t, "lo")
	c := StartCapture(t, "lo", []int{captured.port}, 10*time.Second)
	if !promiscuous(t, "lo") {
		t.Errorf("lo is not promiscuous while the capture runs")
	}

	send(t, captured, "AUTH alice sec", "ret-password\r\n")
	send(t, other, "other-needle")
	report := c.Stop()

	t.Logf("Report: %+v", report)
	want := CaptureReport{Segments: 2, Bytes: len("AUTH alice secret-password\r\n"), Flows: 1}
	if report.Frames == 0 || report.Segments != want.Segments || report.Bytes != want.Bytes ||
		report.Flows != want.Flows || report.Truncated || report.Dropped != 0 {
		t.Errorf("Report %+v, want a few frames and %+v", report, want)
	}
	sightings := c.Find([]byte("secret-password"))
	towards := "->127.0.0.1:" + strconv.Itoa(captured.port)
	// The offset shows that loopback's two copies of each segment were recorded once.
	if len(sightings) != 1 || !strings.HasSuffix(sightings[0].Flow, towards) ||
		sightings[0].Offset != len("AUTH alice ") || sightings[0].Needle != "secret-password" {
		t.Errorf("Sightings of secret-password: %+v, want one at offset %d of a flow %s",
			sightings, len("AUTH alice "), towards)
	}
	if s := c.Find([]byte("other-needle")); len(s) != 0 {
		t.Errorf("Sightings of other-needle, sent on a port not captured: %+v, want none", s)
	}
	if promiscuous(t, "lo") && !wasPromiscuous {
		t.Errorf("lo is still promiscuous after the capture stopped")
	}
}

func TestCaptureStopsByItselfAtItsLimit(t *testing.T) {
	checkNoGoroutineLeft(t)
	sink := startSink(t)
	start := time.Now()
	wasPromiscuous := promiscuous(t, "lo")
	c := StartCapture(t, "lo", []int{sink.port}, 300*time.Millisecond)

	conn := dial(t, sink)
	write(t, conn, "early-needle")
	time.Sleep(time.Until(start.Add(600 * time.Millisecond)))
	write(t, conn, "late-needle")
	finish(t, sink, conn, "early-needlelate-needle")
	if promiscuous(t, "lo") && !wasPromiscuous {
		t.Errorf("lo is still promiscuous after the capture's limit")
	}

	time.Sleep(time.Until(start.Add(time.Second)))
	stopping := time.Now()
	report := c.Stop()
	if took := time.Since(stopping); took > 50*time.Millisecond {
		t.Errorf("Stop after the limit took %v, want it at once", took)
	}
	if report.Segments != 1 || report.Bytes != len("early-needle") || report.Dropped != 0 {
		t.Errorf("Report %+v, want the one segment sent before the limit", report)
	}
	if s := c.Find([]byte("early-needle")); len(s) != 1 {
		t.Errorf("Sightings of early-needle, sent before the limit: %+v, want one", s)
	}
	if s := c.Find([]byte("late-needle")); len(s) != 0 {
		t.Errorf("Sightings of late-needle, sent after the limit: %+v, want none", s)
	}
	if again := c.Stop(); again != report {
		t.Errorf("Second Stop returned %+v, want %+v", again, report)
	}
}

func TestCaptureParsesFrames(t *testing.T) {
	payload := []byte("AUTH alice secret")
	v4src, v4dst := []byte{10, 212, 0, 5}, []byte{10, 212, 0, 7}
	v4 := func(tcp []byte) []byte { return ipv4Packet(v4src, v4dst, 6, 0, 0, tcp) }
	v6 := func(next byte, ext, tcp []byte) []byte { return ipv6Packet(next, append(ext, tcp...)) }
	seg := tcpSegment(41234, 6379, 0, payload)
	const v4flow, v6flow = "10.212.0.5:41234->10.212.0.7:6379", "[fd00::5]:41234->[fd00::7]:6379"
	hopByHop := append([]byte{6, 0}, make([]byte, 6)...)

	cases := map[string]struct {
		frame []byte
		flow  string // empty when the frame holds no TCP segment to keep
	}{
		"IPv4":                          {ethernetFrame(0x0800, false, v4(seg)), v4flow},
		"IPv4 behind an 802.1Q tag":     {ethernetFrame(0x0800, true, v4(seg)), v4flow},
		"IPv4 with options, padded":     {append(ethernetFrame(0x0800, false, ipv4Packet(v4src, v4dst, 6, 0, 4, seg)), 0, 0, 0), v4flow},
		"TCP with options":              {ethernetFrame(0x0800, false, v4(tcpSegment(41234, 6379, 12, payload))), v4flow},
		"IPv4 later fragment":           {ethernetFrame(0x0800, false, ipv4Packet(v4src, v4dst, 6, 185, 0, seg)), ""},
		"UDP":                           {ethernetFrame(0x0800, false, ipv4Packet(v4src, v4dst, 17, 0, 0, seg)), ""},
		"IPv6":                          {ethernetFrame(0x86dd, false, v6(6, nil, seg)), v6flow},
		"IPv6 with a hop-by-hop header": {ethernetFrame(0x86dd, false, v6(0, hopByHop, seg)), v6flow},
		"IPv6 fragment":                 {ethernetFrame(0x86dd, false, v6(44, make([]byte, 8), seg)), ""},
		"ARP":                           {ethernetFrame(0x0806, false, make([]byte, 28)), ""},
		"IPv4 cut short":                {ethernetFrame(0x0800, false, v4(seg))[:30], ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := parseFrame(tc.frame)
			if tc.flow == "" {
				if ok {
					t.Errorf("parseFrame found %v->%v %q, want nothing", got.src, got.dst, got.payload)
				}
				return
			}
			if flow := got.src.String() + "->" + got.dst.String(); !ok || flow != tc.flow || !bytes.Equal(got.payload, payload) {
				t.Errorf("parseFrame = %s %q (ok %v), want %s %q", flow, got.payload, ok, tc.flow, payload)
			}
		})
	}
}

func TestCaptureKeepsPayloadUpToItsCap(t *testing.T) {
	c := newCapture("test", false, 20)
	if err := c.setPorts([]int{6379}); err != nil {
		t.Fatal(err)
	}
	packet := func(p string) []byte {
		return ethernetFrame(0x0800, false, ipv4Packet([]byte{10, 0, 0, 1}, []byte{10, 0, 0, 2}, 6, 0, 0, tcpSegment(41234, 6379, 0, []byte(p))))
	}
	c.recordFrame(packet("AUTH alice sec"), false, false)
	c.recordFrame(packet("ret-password"), false, false)

	if c.bytes != 20 || !c.truncated || c.segments != 2 {
		t.Errorf("Kept %d bytes of 2 segments (truncated %v), want 20 of 2, truncated", c.bytes, c.truncated)
	}
	if s := c.Find([]byte("secret")); len(s) != 1 || s[0].Offset != len("AUTH alice ") {
		t.Errorf("Sightings of secret, within the cap: %+v, want one at %d", s, len("AUTH alice "))
	}
	if s := c.Find([]byte("secret-password")); len(s) != 0 {
		t.Errorf("Sightings of secret-password, beyond the cap: %+v, want none", s)
	}
}

func TestCaptureShowsNeedlesPrintably(t *testing.T) {
	cases := map[string]struct{ needle, want string }{
		"plain":           {"secret", "secret"},
		"control bytes":   {"a\r\n\\", `a\x0d\x0a\\`},
		"long":            {strings.Repeat("x", 41), strings.Repeat("x", 37) + "..."},
		"long and binary": {strings.Repeat("\x00", 11), strings.Repeat(`\x00`, 9) + "..."},
		"exactly 40":      {strings.Repeat("y", 40), strings.Repeat("y", 40)},
	}
	for name, tc := range cases {
		if got := printable([]byte(tc.needle)); got != tc.want || len(got) > 40 {
			t.Errorf("%s: printable(%q) = %q, want %q", name, tc.needle, got, tc.want)
		}
	}
}

// checkNoGoroutineLeft fails the test if a goroutine it started (the capture's reader, a sink) is
// still running once its cleanups, which stop them, have run.
func checkNoGoroutineLeft(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

// promiscuous says whether the interface has IFF_PROMISC set.
func promiscuous(t *testing.T, iface string) bool {
	t.Helper()
	b, err := os.ReadFile("/sys/class/net/" + iface + "/flags")
	if err != nil {
		t.Fatalf("Reading the flags of %s: %v", iface, err)
	}
	flags, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 32)
	if err != nil {
		t.Fatalf("Parsing the flags of %s: %v", iface, err)
	}
	return flags&0x100 != 0
}

// sink accepts one connection on loopback and hands over all it received.
type sink struct {
	port int
	got  chan string
}

func startSink(t *testing.T) *sink {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listening on loopback: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &sink{port: ln.Addr().(*net.TCPAddr).Port, got: make(chan string, 1)}
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			s.got <- ""
			return
		}
		defer conn.Close()
		b, _ := io.ReadAll(conn)
		s.got <- string(b)
	}()
	return s
}

// send writes each piece as its own segment, 20ms apart, and waits until the sink has them all,
// so that the capture has them too.
func send(t *testing.T, s *sink, pieces ...string) {
	t.Helper()
	conn := dial(t, s)
	for i, p := range pieces {
		if i > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		write(t, conn, p)
	}
	finish(t, s, conn, strings.Join(pieces, ""))
}

func dial(t *testing.T, s *sink) *net.TCPConn {
	t.Helper()
	conn, err := net.DialTCP("tcp4", nil, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: s.port})
	if err != nil {
		t.Fatalf("Connecting to port %d: %v", s.port, err)
	}
	t.Cleanup(func() { conn.Close() })
	// Without Nagle's delay each write leaves as a segment of its own.
	if err := conn.SetNoDelay(true); err != nil {
		t.Fatalf("Setting TCP_NODELAY: %v", err)
	}
	return conn
}

func write(t *testing.T, conn *net.TCPConn, p string) {
	t.Helper()
	if _, err := conn.Write([]byte(p)); err != nil {
		t.Fatalf("Writing %q: %v", p, err)
	}
}

// finish closes the sending side and waits for the sink to have received want.
func finish(t *testing.T, s *sink, conn *net.TCPConn, want string) {
	t.Helper()
	if err := conn.CloseWrite(); err != nil {
		t.Fatalf("Closing the sending side: %v", err)
	}
	select {
	case got := <-s.got:
		if got != want {
			t.Fatalf("The sink on port %d received %q, want %q", s.port, got, want)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("The sink on port %d received nothing within 2s", s.port)
	}
}

// ethernetFrame wraps a packet in an Ethernet II header, with an 802.1Q tag if asked.
func ethernetFrame(etherType uint16, tagged bool, packet []byte) []byte {
	frame := make([]byte, 12, 18+len(packet)) // zero addresses, as on loopback
	if tagged {
		frame = binary.BigEndian.AppendUint16(frame, 0x8100)
		frame = binary.BigEndian.AppendUint16(frame, 42)
	}
	frame = binary.BigEndian.AppendUint16(frame, etherType)
	return append(frame, packet...)
}

// ipv4Packet builds an IPv4 header with optionBytes of options around a payload; fragment is the
// fragment offset in 8-byte units.
func ipv4Packet(src, dst []byte, protocol byte, fragment uint16, optionBytes int, payload []byte) []byte {
	headerLen := 20 + optionBytes
	p := make([]byte, headerLen, headerLen+len(payload))
	p[0] = 0x40 | byte(headerLen/4)
	binary.BigEndian.PutUint16(p[2:4], uint16(headerLen+len(payload)))
	binary.BigEndian.PutUint16(p[6:8], fragment)
	p[8], p[9] = 64, protocol
	copy(p[12:16], src)
	copy(p[16:20], dst)
	return append(p, payload...)
}

// ipv6Packet builds an IPv6 header from fd00::5 to fd00::7 around a payload.
func ipv6Packet(next byte, payload []byte) []byte {
	p := make([]byte, 40, 40+len(payload))
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:6], uint16(len(payload)))
	p[6], p[7] = next, 64
	copy(p[8:24], net.ParseIP("fd00::5"))
	copy(p[24:40], net.ParseIP("fd00::7"))
	return append(p, payload...)
}

// tcpSegment builds a TCP header with optionBytes of options (a multiple of 4) before a payload.
func tcpSegment(src, dst uint16, optionBytes int, payload []byte) []byte {
	headerLen := 20 + optionBytes
	s := make([]byte, headerLen, headerLen+len(payload))
	binary.BigEndian.PutUint16(s[0:2], src)
	binary.BigEndian.PutUint16(s[2:4], dst)
	s[12] = byte(headerLen/4) << 4
	for i := 20; i < headerLen; i++ {
		s[i] = 1 // NOP
	}
	return append(s, payload...)
}
