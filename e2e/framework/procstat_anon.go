package framework

// AnonRSS is the part of the resident set not backed by files (the heap,
// stacks: what the program itself holds), RssAnon in /proc/<pid>/status.
func AnonRSS(pid int) (int64, error) { return procStatus(pid, "RssAnon:") }
