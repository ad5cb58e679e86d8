package bench

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// scripted is a contender whose writes counter follows a script, one value
// a scrape; the last value repeats.
type scripted struct {
	mu     sync.Mutex
	writes []float64
	at     []time.Time
}

func (c *scripted) PID() int { return os.Getpid() }
func (c *scripted) halt()    {}
func (c *scripted) metrics() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.writes[min(len(c.at), len(c.writes)-1)]
	c.at = append(c.at, time.Now())
	return fmt.Sprintf("rest_client_requests_total{code=\"201\",host=\"h\",method=\"POST\"} %g\n", w), nil
}

func TestConvergeEndsAfterTheLastWrite(t *testing.T) {
	q := quietness{quiet: 60 * time.Millisecond, limit: 5 * time.Second, every: 20 * time.Millisecond}
	tests := []struct {
		name   string
		writes []float64
		// lastScrape is the scrape (0-based) that first saw the final count.
		lastScrape int
	}{
		{name: "already quiet", writes: []float64{7}, lastScrape: 0},
		{name: "writes on after its pods", writes: []float64{100, 150, 200, 250, 250}, lastScrape: 3},
		{name: "a pause shorter than quiet", writes: []float64{1, 2, 2, 3}, lastScrape: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &scripted{writes: tt.writes}
			s, last, err := q.converge(t.Logf, c)
			if err != nil {
				t.Fatal(err)
			}
			if want := tt.writes[len(tt.writes)-1]; s.writes != want {
				t.Errorf("ended at %g writes, want %g", s.writes, want)
			}
			// The scrape's time is taken before the contender answers.
			if last.After(c.at[tt.lastScrape]) || (tt.lastScrape > 0 && !last.After(c.at[tt.lastScrape-1])) {
				t.Errorf("last write seen at %s, want at scrape %d (%s)", last, tt.lastScrape, c.at[tt.lastScrape])
			}
			if quietFor := c.at[len(c.at)-1].Sub(c.at[tt.lastScrape]); quietFor < q.quiet-q.every {
				t.Errorf("ended %s after the last write, want about %s", quietFor, q.quiet)
			}
		})
	}
}

func TestConvergeGivesUpOnAWriterThatNeverStops(t *testing.T) {
	q := quietness{quiet: 100 * time.Millisecond, limit: 300 * time.Millisecond, every: 20 * time.Millisecond}
	writes := make([]float64, 1000)
	for i := range writes {
		writes[i] = float64(i)
	}
	var logged []string
	start := time.Now()
	s, _, err := q.converge(func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }, &scripted{writes: writes})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("took %s, want about the limit %s", took, q.limit)
	}
	if s.writes == 0 || len(logged) != 1 {
		t.Errorf("ended at %g writes with log %q, want the latest count and one line that it still writes", s.writes, logged)
	}
}
