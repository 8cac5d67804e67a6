package testground

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Redis is a redis-server on a loopback port with an admin ACL user and the default user disabled
// (so that a wrong password cannot pass for the default user).
type Redis struct {
	Port          int
	AdminUser     string
	AdminPassword string
	proc          *Process
}

// StartRedis starts redis-server with the given extra arguments (for example --aclfile PATH; then
// the admin user must be in that file, and no --user is given).
func StartRedis(dir string, extraArgs ...string) (*Redis, error) {
	bin, err := SystemBinary("redis-server", "redis-server")
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	r := &Redis{Port: port, AdminUser: "admin", AdminPassword: randomHex(16)}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no"}
	if !slices.Contains(extraArgs, "--aclfile") {
		args = append(args, "--user", "default", "off",
			"--user", r.AdminUser, "on", ">"+r.AdminPassword, "~*", "&*", "+@all")
	}
	args = append(args, extraArgs...)
	r.proc, err = StartProcess(dir, fmt.Sprintf("redis-%d", port), bin, args, nil)
	if err != nil {
		return nil, err
	}
	if err := waitFor(r.proc, 10*time.Second, func() error { return dialRedis(r.Addr()) }); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

// Addr is host:port of the server.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)) }

// Process is the redis-server process.
func (r *Redis) Process() *Process { return r.proc }

// Stop ends the server.
func (r *Redis) Stop() { r.proc.Stop() }

// WhoAmI authenticates with username and password and returns what ACL WHOAMI answers, so that a
// wrong password cannot be mistaken for success by the default user.
func (r *Redis) WhoAmI(username, password string) (string, error) {
	return RedisWhoAmI(r.Addr(), username, password)
}

// Do authenticates as username and runs one command, returning a simple or bulk string reply.
func (r *Redis) Do(username, password string, args ...string) (string, error) {
	return redisDo(r.Addr(), username, password, args...)
}

// RedisWhoAmI authenticates against addr and returns the user Redis says the connection runs as.
// A user whose rules deny ACL WHOAMI (keyroll denies application users every ACL command) has
// still logged in as itself when AUTH with its name and password succeeded: that is the answer.
func RedisWhoAmI(addr, username, password string) (string, error) {
	who, err := redisDo(addr, username, password, "ACL", "WHOAMI")
	if err != nil && strings.Contains(err.Error(), "NOPERM") && strings.Contains(err.Error(), "'acl|whoami'") {
		return username, nil
	}
	return who, err
}

// RedisDo connects to a Redis at addr, authenticates and runs one command.
func RedisDo(addr, username, password string, args ...string) (string, error) {
	return redisDo(addr, username, password, args...)
}

// redisDo connects to addr, authenticates and runs one command.
func redisDo(addr, username, password string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	rd := bufio.NewReader(c)
	if _, err := redisCommand(c, rd, "AUTH", username, password); err != nil {
		return "", err
	}
	return redisCommand(c, rd, args...)
}

func dialRedis(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	// PING answers even when authentication is needed (-NOAUTH): any reply means the server is up.
	_, err = redisCommand(c, bufio.NewReader(c), "PING")
	if err != nil && strings.HasPrefix(err.Error(), "redis:") {
		return nil
	}
	return err
}

// redisCommand sends one command in RESP and reads a simple string, integer or bulk string reply
// (an integer as its decimal digits).
func redisCommand(c net.Conn, rd *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "+"), strings.HasPrefix(line, ":"):
		return line[1:], nil
	case strings.HasPrefix(line, "-"):
		return "", fmt.Errorf("redis: %s", line[1:])
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("redis: unexpected reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	default:
		return "", fmt.Errorf("redis: unexpected reply %q", line)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
