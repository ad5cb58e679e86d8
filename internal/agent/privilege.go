package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// capSysAdmin is CAP_SYS_ADMIN's bit in a capability set.
const capSysAdmin = 21

// RunsUnprivileged reports whether the agent's container is not
// privileged, from its effective capabilities: a privileged container
// holds every one (and sees the host's device nodes); the chart's
// unprivileged agent (nodeAgent.privileged=false) drops them all. Without
// NVIDIA's runtime as the node's default such an agent has no GPU device
// node, and NVML cannot work there by configuration: its failure is then
// reported as Unprivileged, not as a driver that is missing.
func RunsUnprivileged() bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	return withoutSysAdmin(bufio.NewScanner(f))
}

// withoutSysAdmin reads a /proc/<pid>/status: true when its CapEff lacks
// CAP_SYS_ADMIN; false when it has it or says nothing readable.
func withoutSysAdmin(s *bufio.Scanner) bool {
	for s.Scan() {
		hex, ok := strings.CutPrefix(s.Text(), "CapEff:")
		if !ok {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		return err == nil && caps&(1<<capSysAdmin) == 0
	}
	return false
}
