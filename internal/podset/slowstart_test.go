package podset

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func manyPods(n int) []*corev1.Pod {
	out := make([]*corev1.Pod, n)
	for i := range out {
		out[i] = &corev1.Pod{}
	}
	return out
}

// The first window is FirstBatch calls: none more starts until one ends.
func TestSlowStartFirstWindow(t *testing.T) {
	release := make(chan struct{})
	var started atomic.Int64
	go func() {
		deadline := time.Now().Add(5 * time.Second)
		for started.Load() < FirstBatch && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // a 9th call would have started by now
		if n := started.Load(); n != FirstBatch {
			t.Errorf("%d calls in flight before any ended, want %d", n, FirstBatch)
		}
		close(release)
	}()
	n, err := slowStart(manyPods(100), func(*corev1.Pod) error {
		started.Add(1)
		<-release
		return nil
	})
	if n != 100 || err != nil {
		t.Fatalf("slowStart = %d, %v; want 100, nil", n, err)
	}
}

// The window grows by one per success up to inFlight, never beyond.
func TestSlowStartCapsInFlight(t *testing.T) {
	var now, peak atomic.Int64
	n, err := slowStart(manyPods(2000), func(*corev1.Pod) error {
		c := now.Add(1)
		for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
		}
		time.Sleep(200 * time.Microsecond)
		now.Add(-1)
		return nil
	})
	if n != 2000 || err != nil {
		t.Fatalf("slowStart = %d, %v; want 2000, nil", n, err)
	}
	if p := peak.Load(); p > inFlight || p <= FirstBatch {
		t.Fatalf("peak in flight %d, want above %d and at most %d", p, FirstBatch, inFlight)
	}
}

// After the first error no call starts; the calls in flight finish and
// their errors are all returned.
func TestSlowStartStopsAtTheFirstError(t *testing.T) {
	var mu sync.Mutex
	var calls, afterErr int
	failed := false
	boom := errors.New("refused")
	n, err := slowStart(manyPods(500), func(*corev1.Pod) error {
		mu.Lock()
		calls++
		if failed {
			afterErr++
		}
		i := calls
		mu.Unlock()
		time.Sleep(time.Millisecond)
		if i >= 40 {
			mu.Lock()
			failed = true
			mu.Unlock()
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("error %v, want %v", err, boom)
	}
	if calls >= 500 || n < 39-inFlight || n > 39 {
		t.Fatalf("%d calls, %d succeeded: the pass must stop soon after call 40", calls, n)
	}
	// A call admitted before the failure was recorded may still start
	// after it; at most a window's worth.
	if afterErr > inFlight {
		t.Fatalf("%d calls started after the first error, want at most the %d in flight", afterErr, inFlight)
	}
}
