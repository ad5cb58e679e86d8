package framework

import "testing"

// The machine's CPU counters only grow, and busy time is part of the total.
func TestMachineCPU(t *testing.T) {
	b0, t0, err := MachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1e7; i++ { // a little work, so the counters move
		_ = i * i
	}
	b1, t1, err := MachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	// Ticks of 1/100 s, as float64: compare with a tick's slack.
	const tick = 0.01
	if b0 <= 0 || b0 > t0+tick || b1 > t1+tick || b1 < b0-tick || t1 < t0-tick {
		t.Errorf("busy/total %v/%v then %v/%v: want 0 < busy <= total, both non-decreasing", b0, t0, b1, t1)
	}
}
