package testground

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// The janitor is a process of its own (this test binary, started again) that outlives the test
// process: it waits until its standard input closes, which happens when the test process ends in
// any way, panics and timeouts included, and then cleans the node up unless Stop already did.
const janitorEnv = "KEYROLL_TESTGROUND_NODE_JANITOR"

func init() {
	if os.Getenv(janitorEnv) == "1" {
		os.Exit(runJanitor())
	}
}

func runJanitor() int {
	_, _ = io.Copy(io.Discard, os.Stdin) // returns when the test process is gone or Stop closed the pipe
	s, err := loadNodeState()
	if errors.Is(err, os.ErrNotExist) {
		return 0 // Stop cleaned up
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testground janitor: %v\n", err)
		return 1
	}
	// The test process's own children die with it (parent-death signal); give them a moment.
	time.Sleep(500 * time.Millisecond)
	if err := cleanupNode(s); err != nil {
		fmt.Fprintf(os.Stderr, "testground janitor: %v\n", err)
		return 1
	}
	if os.Getenv("KEYROLL_KEEP_TESTGROUND") == "" {
		_ = os.RemoveAll(s.Dir)
	}
	return 0
}

// janitor is the running janitor process, and the pipe that keeps it waiting.
type janitor struct {
	cmd *exec.Cmd
	w   *os.File
}

// startJanitor starts this binary again as a janitor, in a process group of its own (so that
// signals to the test's group do not reach it) with its output in logPath. It inherits the node
// lock, so that no other node starts before it has cleaned up.
func startJanitor(logPath string, lock *os.File) (*janitor, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), janitorEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, logFile, logFile
	cmd.ExtraFiles = []*os.File{lock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	logFile.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("starting the node's janitor: %w", err)
	}
	return &janitor{cmd: cmd, w: w}, nil
}

// release lets the janitor go (after Stop cleaned up, it finds nothing to do) and waits for it.
func (j *janitor) release() {
	if j == nil {
		return
	}
	j.w.Close()
	done := make(chan struct{})
	go func() { _ = j.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = j.cmd.Process.Kill()
		<-done
	}
}
