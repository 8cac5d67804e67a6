package framework

import (
	"encoding/binary"
	"net/netip"
)

// Parsing the frames a capture reads: Ethernet II (one 802.1Q tag at most), IPv4 and IPv6, TCP.

// segment is the part of a TCP segment a capture keeps.
type segment struct {
	src, dst netip.AddrPort
	payload  []byte
}

const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	etherTypeVLAN = 0x8100
	protocolTCP   = 6
)

// parseFrame finds the TCP segment in an Ethernet II frame, with or without one 802.1Q tag. On
// loopback the Ethernet header is there too, with zero addresses.
func parseFrame(frame []byte) (segment, bool) {
	if len(frame) < 14 {
		return segment{}, false
	}
	etherType, packet := binary.BigEndian.Uint16(frame[12:14]), frame[14:]
	if etherType == etherTypeVLAN {
		if len(packet) < 4 {
			return segment{}, false
		}
		etherType, packet = binary.BigEndian.Uint16(packet[2:4]), packet[4:]
	}
	var src, dst netip.Addr
	var tcp []byte
	var ok bool
	switch etherType {
	case etherTypeIPv4:
		src, dst, tcp, ok = parseIPv4(packet)
	case etherTypeIPv6:
		src, dst, tcp, ok = parseIPv6(packet)
	}
	if !ok || len(tcp) < 20 {
		return segment{}, false
	}
	dataOffset := int(tcp[12]>>4) * 4
	if dataOffset < 20 || dataOffset > len(tcp) {
		return segment{}, false
	}
	return segment{
		src:     netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp[0:2])),
		dst:     netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:4])),
		payload: tcp[dataOffset:],
	}, true
}

// parseIPv4 returns the TCP segment of an IPv4 packet, without the frame's padding. Fragments other
// than the first carry no TCP header and are skipped.
func parseIPv4(p []byte) (src, dst netip.Addr, tcp []byte, ok bool) {
	if len(p) < 20 || p[0]>>4 != 4 || p[9] != protocolTCP {
		return src, dst, nil, false
	}
	headerLen, totalLen := int(p[0]&0x0f)*4, int(binary.BigEndian.Uint16(p[2:4]))
	if binary.BigEndian.Uint16(p[6:8])&0x1fff != 0 {
		return src, dst, nil, false
	}
	if totalLen == 0 {
		totalLen = len(p) // BIG TCP: a segment over 64 KiB leaves the length 0
	}
	if headerLen < 20 || headerLen > totalLen || totalLen > len(p) {
		return src, dst, nil, false
	}
	src, dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
	return src, dst, p[headerLen:totalLen], true
}

// parseIPv6 returns the TCP segment of an IPv6 packet. It steps over the extension headers that
// share one layout (hop-by-hop, routing, destination options); fragments are skipped.
func parseIPv6(p []byte) (src, dst netip.Addr, tcp []byte, ok bool) {
	if len(p) < 40 || p[0]>>4 != 6 {
		return src, dst, nil, false
	}
	payloadLen, next := int(binary.BigEndian.Uint16(p[4:6])), p[6]
	src, dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
	rest := p[40:]
	if payloadLen == 0 {
		payloadLen = len(rest) // a jumbogram (BIG TCP) leaves the length 0
	}
	if payloadLen > len(rest) {
		return src, dst, nil, false
	}
	rest = rest[:payloadLen]
	for next == 0 || next == 43 || next == 60 {
		if len(rest) < 8 || (int(rest[1])+1)*8 > len(rest) {
			return src, dst, nil, false
		}
		next, rest = rest[0], rest[(int(rest[1])+1)*8:]
	}
	return src, dst, rest, next == protocolTCP
}
