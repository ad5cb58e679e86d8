package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/loom-dev/loom/e2e/framework"
)

// Table is every scenario's printed result: label and value rows, blank
// lines between sections, and tables of the manager's API requests. Columns
// align within a section.
type Table struct{ tw *tabwriter.Writer }

// NewTable writes to w; Flush ends it.
func NewTable(w io.Writer) *Table { return &Table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)} }

// Row writes a label and a value formatted from format and args.
func (t *Table) Row(label, format string, args ...any) {
	fmt.Fprintf(t.tw, "%s\t%s\n", label, fmt.Sprintf(format, args...))
}

// Cells writes one row of several columns.
func (t *Table) Cells(cells ...string) { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }

// Blank ends a section.
func (t *Table) Blank() { fmt.Fprintln(t.tw) }

// Column is one phase's API requests in Requests.
type Column struct {
	Name   string
	Counts map[framework.APIRequest]float64
	// PerMinuteOf, when set, shows the counts per minute of this window.
	PerMinuteOf time.Duration
}

func (c Column) value(v float64) string {
	if c.PerMinuteOf > 0 {
		return fmt.Sprintf("%.1f", v/c.PerMinuteOf.Minutes())
	}
	return fmt.Sprintf("%.0f", v)
}

// Requests writes a section of the manager's API requests by verb and
// resource, a column a phase, and their writes apart from the lease.
func (t *Table) Requests(cols ...Column) {
	t.Blank()
	header := []string{"manager API requests"}
	var counts []map[framework.APIRequest]float64
	for _, c := range cols {
		header = append(header, c.Name)
		counts = append(counts, c.Counts)
	}
	t.Cells(header...)
	for _, k := range framework.SortedRequests(counts...) {
		row := []string{k.Verb + " " + k.Resource}
		for _, c := range cols {
			row = append(row, c.value(c.Counts[k]))
		}
		t.Cells(row...)
	}
	row := []string{"writes without the lease"}
	for _, c := range cols {
		row = append(row, c.value(writes(c.Counts)))
	}
	t.Cells(row...)
}

// Flush writes the table out.
func (t *Table) Flush() error { return t.tw.Flush() }

func mib(b int64) string { return fmt.Sprintf("%d MiB", b>>20) }

func round(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
