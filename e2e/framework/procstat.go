package framework

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// RSS is a process's resident set, PeakRSS its high-water mark (bytes), as
// /proc/<pid>/status reports them (VmRSS, VmHWM).
func RSS(pid int) (int64, error)     { return procStatus(pid, "VmRSS:") }
func PeakRSS(pid int) (int64, error) { return procStatus(pid, "VmHWM:") }

// FileRSS is the part of the resident set backed by files (the binary's
// pages; the kernel can drop and reread them), RssFile in /proc/<pid>/status.
func FileRSS(pid int) (int64, error) { return procStatus(pid, "RssFile:") }

func procStatus(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, key) {
			f := strings.Fields(line)
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("%s not in /proc/%d/status", key, pid)
}

// CPUSeconds is the user+system CPU time a process has used
// (/proc/<pid>/stat, in clock ticks of 1/100 s, Linux's USER_HZ).
func CPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after its ")".
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return (utime + stime) / 100, nil
}

// MachineCPU is the machine's busy and total CPU seconds since boot, all
// CPUs together (/proc/stat's first line, in USER_HZ ticks; idle and iowait
// are not busy): over a window, busy/total says how much of the machine
// everything running used.
func MachineCPU() (busy, total float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("unexpected /proc/stat: %q", line)
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parsing /proc/stat: %w", err)
		}
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy / 100, total / 100, nil
}
