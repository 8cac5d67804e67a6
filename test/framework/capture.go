package framework

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A capture is how a test proves that no Redis password, AUTH or ACL SETUSER crosses the network in
// clear when Redis runs TLS-only: it records the TCP payload seen on one interface (the real node's
// bridge, testground.NodeBridge, which every pod and the host sit on) and searches it for the
// secrets afterwards. It reads raw frames itself, so it needs root but neither cgo, libpcap nor tcpdump.
const (
	// captureMaxBytes bounds the payload a capture keeps, so a long test cannot exhaust memory; a
	// capture that reached it reports Truncated, because the secrets might be in what it dropped.
	captureMaxBytes = 256 << 20
	// captureSocketBuffer is what the kernel may queue for the reader: large, so that a burst (a
	// rollout of several Redis pods) is not dropped before the reader gets to it.
	captureSocketBuffer = 8 << 20
	// captureFrameBuffer holds the largest frame the kernel hands over: on loopback and veth the
	// frames are offloaded segments of up to 64 KiB, and BIG TCP allows more.
	captureFrameBuffer = 1 << 20
)

// CaptureReport says what a capture saw. A test that relies on a capture must check Truncated and
// Dropped: a capture that lost payload cannot prove a secret was absent.
type CaptureReport struct {
	Frames    int  // frames read, including loopback's outgoing copies, which are not recorded twice
	Segments  int  // TCP segments on the ports with a payload
	Bytes     int  // payload bytes kept
	Truncated bool // the byte cap was reached: later payload was not kept
	Flows     int  // distinct flows (src ip:port -> dst ip:port) with a payload
	Dropped   int  // frames lost: dropped by the kernel (reader too slow) or larger than the read buffer
}

// Sighting is where a capture found a needle.
type Sighting struct {
	Needle string // printable form, at most 40 chars, non-printables escaped
	Flow   string // e.g. "10.212.0.5:41234->10.212.0.7:6379"
	Offset int    // in the flow's payload, concatenated in arrival order
}

// Capture records TCP payload on one interface; see StartCapture.
type Capture struct {
	t        testing.TB
	iface    string
	loopback bool
	ports    map[uint16]bool
	maxBytes int

	fd    int // the AF_PACKET socket
	wake  int // an eventfd that halt writes, so the reader need not poll with a timeout
	timer *time.Timer
	done  chan struct{} // closed when the reader has closed the socket

	haltOnce sync.Once
	stopOnce sync.Once
	report   CaptureReport

	mu        sync.Mutex
	flows     map[flowKey]*flow
	frames    int
	segments  int
	bytes     int
	oversized int
	dropped   int
	truncated bool
	err       error // the first failure of the reader or of halt
}

type flowKey struct{ src, dst netip.AddrPort }

type flow struct {
	name    string
	payload []byte
}

// StartCapture opens an AF_PACKET raw socket (ETH_P_ALL) bound to the interface iface, in promiscuous
// mode, and records the TCP payload of every frame whose source or destination port is one of ports,
// until Stop is called or limit has passed (then it stops by itself). It fails the test when the
// socket cannot be opened, e.g. not root.
//
// Promiscuous mode matters on a bridge: frames between two pods are forwarded from one port to
// the other and reach the bridge device, where the socket listens, only while it is promiscuous.
// The kernel drops the membership when the socket closes. Filter on the ports a pod listens on:
// on the bridge, traffic to a Service is seen after its address was translated to the pod's.
func StartCapture(t testing.TB, iface string, ports []int, limit time.Duration) *Capture {
	t.Helper()
	if limit <= 0 {
		t.Fatalf("Starting a capture on %s: the limit %v is not positive", iface, limit)
	}
	c, err := openCapture(iface, ports)
	if err != nil {
		t.Fatalf("Starting a capture on %s: %v", iface, err)
	}
	c.t = t
	go c.read()
	c.timer = time.AfterFunc(limit, c.halt)
	t.Cleanup(func() { c.Stop() })
	return c
}

// openCapture checks the interface and ports and opens the socket, ready to read.
func openCapture(iface string, ports []int) (*Capture, error) {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, fmt.Errorf("finding the interface: %w", err)
	}
	c := newCapture(iface, ifc.Flags&net.FlagLoopback != 0, captureMaxBytes)
	if err := c.setPorts(ports); err != nil {
		return nil, err
	}
	c.fd, err = openPacketSocket(ifc.Index)
	if err != nil {
		return nil, err
	}
	c.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(c.fd)
		return nil, fmt.Errorf("creating the eventfd that stops the reader: %w", err)
	}
	return c, nil
}

func newCapture(iface string, loopback bool, maxBytes int) *Capture {
	return &Capture{
		iface: iface, loopback: loopback, maxBytes: maxBytes,
		ports: map[uint16]bool{}, flows: map[flowKey]*flow{}, done: make(chan struct{}),
	}
}

func (c *Capture) setPorts(ports []int) error {
	if len(ports) == 0 {
		return errors.New("no ports given: nothing would be recorded")
	}
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("port %d is not a TCP port", p)
		}
		c.ports[uint16(p)] = true
	}
	return nil
}

// openPacketSocket returns a raw packet socket that receives every frame of the interface.
func openPacketSocket(ifindex int) (int, error) {
	// Protocol 0 receives nothing until bind: a socket opened for ETH_P_ALL would queue the frames
	// of every interface in the meantime.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening an AF_PACKET socket (needs root or CAP_NET_RAW): %w", err)
	}
	if err := configurePacketSocket(fd, ifindex); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func configurePacketSocket(fd, ifindex int) error {
	// SO_RCVBUFFORCE passes net.core.rmem_max, which would silently cap SO_RCVBUF.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, captureSocketBuffer); err != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, captureSocketBuffer); err != nil {
			return fmt.Errorf("setting the socket's receive buffer: %w", err)
		}
	}
	promisc := unix.PacketMreq{Ifindex: int32(ifindex), Type: unix.PACKET_MR_PROMISC}
	if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &promisc); err != nil {
		return fmt.Errorf("putting the interface in promiscuous mode: %w", err)
	}
	all := &unix.SockaddrLinklayer{Protocol: networkOrder(unix.ETH_P_ALL), Ifindex: ifindex}
	if err := unix.Bind(fd, all); err != nil {
		return fmt.Errorf("binding the socket to the interface: %w", err)
	}
	return nil
}

// networkOrder returns v in the byte order the kernel expects in sll_protocol.
func networkOrder(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// Stop ends the capture and says what it saw. Frames queued before Stop are still recorded. Later
// calls return the same report.
func (c *Capture) Stop() CaptureReport {
	c.stopOnce.Do(func() {
		c.timer.Stop()
		c.halt()
		<-c.done
		c.mu.Lock()
		defer c.mu.Unlock()
		c.report = CaptureReport{
			Frames: c.frames, Segments: c.segments, Bytes: c.bytes, Truncated: c.truncated,
			Flows: len(c.flows), Dropped: c.dropped + c.oversized,
		}
		if c.err != nil {
			c.t.Errorf("Capture on %s: %v", c.iface, c.err)
		}
	})
	return c.report
}

// halt stops the kernel from queueing more frames, keeping those it queued, and wakes the reader
// to read them and return. Closing the socket instead would lose frames sent just before Stop.
func (c *Capture) halt() {
	c.haltOnce.Do(func() {
		rejectAll := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
		prog := &unix.SockFprog{Len: uint16(len(rejectAll)), Filter: &rejectAll[0]}
		if err := unix.SetsockoptSockFprog(c.fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, prog); err != nil {
			c.fail(fmt.Errorf("attaching the filter that ends the capture: %w", err))
		}
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		if _, err := unix.Write(c.wake, one[:]); err != nil {
			c.fail(fmt.Errorf("waking the reader: %w", err))
		}
	})
}

// read records frames until halt, then closes the socket: promiscuous mode ends with the capture,
// at its limit as well as at Stop.
func (c *Capture) read() {
	defer close(c.done)
	defer c.closeSocket()
	if err := c.readUntilHalted(); err != nil {
		c.fail(err)
		c.halt() // before the socket closes, so that halt never touches a closed descriptor
	}
}

func (c *Capture) readUntilHalted() error {
	buf := make([]byte, captureFrameBuffer)
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}, {Fd: int32(c.wake), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return fmt.Errorf("waiting for frames: %w", err)
		}
		halted := fds[1].Revents != 0
		if err := c.readQueued(buf); err != nil {
			return fmt.Errorf("reading a frame: %w", err)
		}
		if halted {
			return nil
		}
	}
}

// closeSocket keeps the kernel's count of dropped frames and closes the descriptors.
func (c *Capture) closeSocket() {
	stats, err := unix.GetsockoptTpacketStats(c.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		c.fail(fmt.Errorf("reading the count of dropped frames: %w", err))
	} else {
		c.mu.Lock()
		c.dropped = int(stats.Drops)
		c.mu.Unlock()
	}
	unix.Close(c.fd)
	unix.Close(c.wake)
}

// readQueued records the frames queued on the socket.
func (c *Capture) readQueued(buf []byte) error {
	for {
		// MSG_TRUNC makes n the frame's real length, so a frame larger than buf is noticed.
		n, from, err := unix.Recvfrom(c.fd, buf, unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		switch {
		case err == unix.EAGAIN:
			return nil
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		}
		ll, _ := from.(*unix.SockaddrLinklayer)
		outgoing := ll != nil && ll.Pkttype == unix.PACKET_OUTGOING
		c.recordFrame(buf[:min(n, len(buf))], n > len(buf), outgoing)
	}
}

func (c *Capture) recordFrame(frame []byte, oversized, outgoing bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frames++
	if oversized {
		c.oversized++
		return
	}
	// Loopback hands every packet to the socket twice, as it leaves and as it arrives: only the
	// arrival is recorded, so that a flow's payload is not doubled.
	if c.loopback && outgoing {
		return
	}
	seg, ok := parseFrame(frame)
	if !ok || len(seg.payload) == 0 || (!c.ports[seg.src.Port()] && !c.ports[seg.dst.Port()]) {
		return
	}
	c.keep(seg)
}

// keep appends a segment's payload to its flow, within the byte cap. The caller holds mu.
func (c *Capture) keep(seg segment) {
	c.segments++
	payload := seg.payload
	if room := c.maxBytes - c.bytes; len(payload) > room {
		payload = payload[:room]
		c.truncated = true
	}
	if len(payload) == 0 {
		return
	}
	key := flowKey{seg.src, seg.dst}
	f := c.flows[key]
	if f == nil {
		f = &flow{name: seg.src.String() + "->" + seg.dst.String()}
		c.flows[key] = f
	}
	f.payload = append(f.payload, payload...)
	c.bytes += len(payload)
}

func (c *Capture) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

// Find returns, for each needle and each flow whose payload holds it, the first place it occurs.
// Payloads are kept per flow (per direction) in arrival order and searched concatenated, so a
// needle split over two segments is still found. It may be called while the capture runs.
func (c *Capture) Find(needles ...[]byte) []Sighting {
	c.mu.Lock()
	defer c.mu.Unlock()
	flows := make([]*flow, 0, len(c.flows))
	for _, f := range c.flows {
		flows = append(flows, f)
	}
	slices.SortFunc(flows, func(a, b *flow) int { return strings.Compare(a.name, b.name) })

	var found []Sighting
	for _, needle := range needles {
		if len(needle) == 0 {
			// An empty needle is found everywhere; more likely the test failed to read a secret.
			c.t.Errorf("Capture on %s: Find was given an empty needle", c.iface)
			continue
		}
		for _, f := range flows {
			if i := bytes.Index(f.payload, needle); i >= 0 {
				found = append(found, Sighting{Needle: printable(needle), Flow: f.name, Offset: i})
			}
		}
	}
	return found
}

// printable shows a needle in a test's message: at most 40 characters, bytes other than printable
// ASCII as \xNN, and "..." where it was cut.
func printable(needle []byte) string {
	var s []byte
	cut := -1 // where s is cut if it grows over 40 characters, leaving room for "..."
	for _, b := range needle {
		piece := fmt.Sprintf(`\x%02x`, b)
		if b == '\\' {
			piece = `\\`
		} else if b >= 0x20 && b < 0x7f {
			piece = string(rune(b))
		}
		if cut < 0 && len(s)+len(piece) > 37 {
			cut = len(s)
		}
		s = append(s, piece...)
	}
	if len(s) > 40 {
		return string(s[:cut]) + "..."
	}
	return string(s)
}
