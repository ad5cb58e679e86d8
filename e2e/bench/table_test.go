package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/loom-dev/loom/e2e/framework"
)

func TestRequestsTable(t *testing.T) {
	var b strings.Builder
	tab := NewTable(&b)
	tab.Row("label", "%d", 7)
	busy := map[framework.APIRequest]float64{{Verb: "create", Resource: "pods"}: 12, {Verb: "update", Resource: "leases"}: 3,
		{Verb: "get", Resource: "nodes"}: 5}
	idle := map[framework.APIRequest]float64{{Verb: "update", Resource: "leases"}: 6}
	tab.Requests(Column{Name: "busy", Counts: busy}, Column{Name: "idle per minute", Counts: idle, PerMinuteOf: 30 * time.Second})
	if err := tab.Flush(); err != nil {
		t.Fatal(err)
	}
	want := `label  7

manager API requests      busy  idle per minute
create pods               12    0.0
get nodes                 5     0.0
update leases             3     12.0
writes without the lease  12    0.0
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
