package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/loom-dev/loom/internal/manager"
)

// Manager is a Loom manager running in the test process.
type Manager struct {
	ctrl.Manager
	// ProbeURL is http://host:port of /healthz and /readyz.
	ProbeURL string
	// MetricsURL is the https URL of /metrics.
	MetricsURL string
	// StartedAt is when Start was called.
	StartedAt time.Time

	cancel context.CancelFunc
	done   chan error
}

// ManagerOptions returns manager options for tests: free loopback ports,
// namespace loom-system, and leader-election timings short enough for
// failover tests.
func ManagerOptions(t testing.TB) manager.Options {
	t.Helper()
	o := manager.DefaultOptions()
	o.Namespace = "loom-system"
	o.ProbeAddr = FreeAddr(t)
	o.MetricsAddr = FreeAddr(t)
	o.LeaseDuration = 4 * time.Second
	o.RenewDeadline = 3 * time.Second
	o.RetryPeriod = 500 * time.Millisecond
	o.GracefulShutdownTimeout = 10 * time.Second
	return o.ForTests()
}

// StartManager builds a manager with the registry's selected controllers and
// runs it until the test ends (or Stop is called).
func (e *Env) StartManager(t testing.TB, opts manager.Options, reg *manager.Registry) *Manager {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := e.CreateNamespace(ctx, opts.Namespace); err != nil {
		cancel()
		t.Fatalf("creating namespace %s: %v", opts.Namespace, err)
	}
	if reg == nil {
		reg = &manager.Registry{}
	}
	mgr, _, err := manager.New(ctx, e.Config, opts, reg)
	if err != nil {
		cancel()
		t.Fatalf("building manager: %v", err)
	}
	m := &Manager{
		Manager:    mgr,
		ProbeURL:   "http://" + opts.ProbeAddr,
		MetricsURL: "https://" + opts.MetricsAddr + "/metrics",
		StartedAt:  time.Now(),
		cancel:     cancel,
		done:       make(chan error, 1),
	}
	go func() { m.done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		if err := m.Stop(); err != nil {
			t.Errorf("manager stopped with error: %v", err)
		}
	})
	return m
}

// Stop cancels the manager and waits until it has returned. Calling it again
// returns nil at once.
func (m *Manager) Stop() error {
	m.cancel()
	select {
	case err, ok := <-m.done:
		if !ok {
			return nil
		}
		close(m.done)
		return err
	case <-time.After(30 * time.Second):
		return errors.New("manager did not stop within 30s")
	}
}

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return fmt.Sprintf("127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port)
}

// Eventually retries f every 100ms until it returns nil, failing the test
// with f's last error after timeout.
func Eventually(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
