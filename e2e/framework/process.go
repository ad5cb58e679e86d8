package framework

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Process is a child process the cluster started. Each runs in its own
// process group (so a stop reaches whatever it forks) and gets SIGKILL if
// this process dies first (so a crashed test or demo leaves nothing behind).
type Process struct {
	Name    string
	LogPath string
	bin     string
	args    []string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	once    sync.Once
	stopped atomic.Bool // Stop was called: its exit is expected
}

// startProcess runs bin with args, logging stdout and stderr to dir/name.log.
func startProcess(dir, name, bin string, env []string, args ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, bin: bin, args: args, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and its error if so.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, waits up to grace, then kills the
// group. It is safe to call more than once.
func (p *Process) Stop(grace time.Duration) {
	p.stopped.Store(true)
	p.once.Do(func() {
		pgid := p.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
		// Anything it forked that outlived it.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
}

// AllowExit tells Check that this process may exit on its own from now on
// (a manager that loses its lease while the API server is down must).
func (p *Process) AllowExit() { p.stopped.Store(true) }

// Kill sends SIGKILL to the process group and waits until it is gone: a
// crash, not a stop (no deferred cleanup, no lease released).
func (p *Process) Kill() {
	p.stopped.Store(true)
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
}

// Tail returns up to the last n bytes of the process's log.
func (p *Process) Tail(n int64) string {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort() (int, error) {
	p, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}
