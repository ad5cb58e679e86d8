package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// cell is the text of the column headed head in the line starting with
// label: the table aligns every cell under its header.
func cell(t *testing.T, table, label, head string) string {
	t.Helper()
	var header, row string
	for _, line := range strings.Split(table, "\n") {
		if header == "" && strings.Contains(line, " "+head+" ") {
			header = line
		}
		if header != "" && strings.HasPrefix(line, label+" ") {
			row = line
			break
		}
	}
	if row == "" {
		t.Fatalf("no column %q on row %q in\n%s", head, label, table)
	}
	// Columns are aligned in runes ("–" and "×" are several bytes).
	at := len([]rune(header[:strings.Index(header, " "+head+" ")+1]))
	runes := []rune(row)
	if at > len(runes) {
		t.Fatalf("row %q ends before column %q", row, head)
	}
	rest := string(runes[at:])
	if end := strings.Index(rest, "  "); end >= 0 {
		rest = rest[:end]
	}
	return strings.TrimSpace(rest)
}

// The raycluster section prints the floor against KubeRay, paired within
// each repetition: how far below KubeRay the machine lets any operator
// get. Memory has no floor value (the floor has no process).
func TestFloorAgainstKubeRayColumn(t *testing.T) {
	runs := func(done ...float64) []CompareRun {
		var rs []CompareRun
		for _, d := range done {
			rs = append(rs, CompareRun{Done: time.Duration(d * float64(time.Second)), PeakRSS: 50 << 20})
		}
		return rs
	}
	r := &CompareReport{Config: CompareConfig{Reps: 3, Clusters: 100, Idle: time.Second}, AnchorNames: map[string]string{},
		Ray: map[string][]CompareRun{
			contLoom:    runs(8, 9, 10),
			contKubeRay: runs(10, 12, 20),
			contFloor:   runs(7, 6, 8),
		}}
	var out bytes.Buffer
	if err := r.Print(&out); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	// Pairs 7/10, 6/12, 8/20: median 0.5, not the ratio of medians (7/12).
	if got, want := cell(t, table, "all RayClusters ready", "floor/KubeRay"), "0.50× (0.40×–0.70×)"; got != want {
		t.Errorf("floor/KubeRay ready %q, want %q\n%s", got, want, table)
	}
	if got, want := cell(t, table, "all RayClusters ready", "Loom/KubeRay"), "0.75× (0.50×–0.80×)"; got != want {
		t.Errorf("Loom/KubeRay ready %q, want %q\n%s", got, want, table)
	}
	if got := cell(t, table, "peak RSS (VmHWM)", "floor/KubeRay"); got != "–" {
		t.Errorf("floor/KubeRay peak RSS %q, want –\n%s", got, table)
	}
}
