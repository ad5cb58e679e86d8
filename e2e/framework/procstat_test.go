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
	if b0 <= 0 || t0 < b0 || b1 < b0 || t1 < t0 || t1-t0 < b1-b0 {
		t.Errorf("busy/total %v/%v then %v/%v: want 0 < busy <= total, both non-decreasing", b0, t0, b1, t1)
	}
}
