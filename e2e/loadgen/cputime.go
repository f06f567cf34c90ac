package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux architecture Go runs on (sysconf(_SC_CLK_TCK)).
const clockTicks = 100

// cpuSeconds returns the user+system CPU time process pid has used so far
// (pid 0: this process), from /proc/<pid>/stat. Used to split a cell's CPU
// between Envoy, the ext_proc server, the upstream and the load client.
func cpuSeconds(pid int) (float64, error) {
	path := "/proc/self/stat"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/stat", pid)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("failed to read %s: %w", path, err)
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis are fixed: state is field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected %s", path)
	}
	f := bytes.Fields(data[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected %s", path)
	}
	var ticks uint64
	for _, s := range f[11:13] {
		n, err := strconv.ParseUint(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected %s: %w", path, err)
		}
		ticks += n
	}
	return float64(ticks) / clockTicks, nil
}
