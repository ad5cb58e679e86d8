package why

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"k8s.io/cli-runtime/pkg/printers"
)

// maxPodsShown caps the pods a wide fleet row names.
const maxPodsShown = 8

// WriteAnswer prints an answer: its line, what to do, further findings and
// the Warning events.
func WriteAnswer(w io.Writer, a Answer) error {
	var b strings.Builder
	b.WriteString(a.Line() + "\n")
	if a.Advice != "" {
		b.WriteString("What to do: " + a.Advice + "\n")
	}
	for _, s := range a.Also {
		b.WriteString("Also: " + s + "\n")
	}
	if len(a.Events) > 0 {
		b.WriteString("Warning events:\n")
		for _, e := range a.Events {
			b.WriteString("  " + e + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// migColumn is a node's MIG layout and its state, e.g. all-1g.10gb (success).
func migColumn(f FleetNode) string {
	switch {
	case f.MIGConfig == "":
		return "-"
	case f.MIGState == "":
		return f.MIGConfig
	}
	return f.MIGConfig + " (" + f.MIGState + ")"
}

// WriteFleet prints the fleet as a table, one row per node and resource;
// wide adds the pods that hold each resource.
func WriteFleet(w io.Writer, fleet []FleetNode, wide bool) error {
	tw := printers.GetNewTabWriter(w)
	head := "NODE\tPRODUCT\tGPUS\tUNHEALTHY\tRESOURCE\tALLOCATABLE\tALLOCATED\tFREE\tMIG\tSCHEDULABLE"
	if wide {
		head += "\tPODS"
	}
	fmt.Fprintln(tw, head)
	for _, f := range fleet {
		rs := f.Resources
		if len(rs) == 0 {
			rs = []ResourceUse{{Name: "-"}}
		}
		for _, r := range rs {
			row := []string{f.Name, dash(f.Product), strconv.Itoa(int(f.GPUs)), strconv.Itoa(len(f.Unhealthy)), r.Name,
				strconv.FormatInt(r.Allocatable, 10), strconv.FormatInt(r.Allocated, 10), strconv.FormatInt(r.Free, 10),
				migColumn(f), strconv.FormatBool(f.Schedulable)}
			if wide {
				row = append(row, podsColumn(r.Pods))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
	}
	return tw.Flush()
}

func podsColumn(pods []string) string {
	if len(pods) == 0 {
		return "-"
	}
	if len(pods) > maxPodsShown {
		return strings.Join(pods[:maxPodsShown], ",") + fmt.Sprintf(",+%d more", len(pods)-maxPodsShown)
	}
	return strings.Join(pods, ",")
}

// WriteUpgrades prints each policy's DriverUpgrade condition, then one row
// per node (no table without nodes); wide adds when its upgrade started and
// its target template.
func WriteUpgrades(w io.Writer, policies []PolicyUpgrade, nodes []UpgradeNode, wide bool) error {
	for _, p := range policies {
		if _, err := fmt.Fprintf(w, "clusterpolicy/%s: DriverUpgrade=%s %s: %s\n", p.Policy, p.Status, p.Reason, p.Message); err != nil {
			return err
		}
	}
	if len(policies) == 0 {
		if _, err := fmt.Fprintln(w, "no ClusterPolicy in force: Loom upgrades no driver"); err != nil {
			return err
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	tw := printers.GetNewTabWriter(w)
	head := "NODE\tSTATE\tCLAIM\tCORDONED\tSINCE\tDETAIL"
	if wide {
		head += "\tSTARTED\tTARGET\tWAS-CORDONED"
	}
	fmt.Fprintln(tw, head)
	for _, n := range nodes {
		row := []string{n.Name, dash(n.State), dash(n.Claim), strconv.FormatBool(n.Cordoned), dash(n.Since), dash(n.Detail)}
		if wide {
			row = append(row, dash(n.Started), dash(n.Target), strconv.FormatBool(n.WasCordoned))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}
