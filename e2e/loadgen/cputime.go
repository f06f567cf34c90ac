package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	st, err := readStat(path)
	if err != nil {
		return 0, err
	}
	return float64(st.utime+st.stime) / clockTicks, nil
}

// procStat is what the CPU split reads of /proc/<pid>/stat.
type procStat struct {
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime uint64
}

func readStat(path string) (procStat, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, fmt.Errorf("failed to read %s: %w", path, err)
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis are fixed: state is field 3, ppid 4, utime 14,
	// stime 15, cutime 16, cstime 17.
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("unexpected %s", path)
	}
	f := bytes.Fields(data[end+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("unexpected %s", path)
	}
	var n [5]uint64
	for i, idx := range []int{1, 11, 12, 13, 14} {
		if n[i], err = strconv.ParseUint(string(f[idx]), 10, 64); err != nil {
			return procStat{}, fmt.Errorf("unexpected %s: %w", path, err)
		}
	}
	return procStat{comm: string(data[open+1 : end]), ppid: int(n[0]), utime: n[1], stime: n[2], cutime: n[3], cstime: n[4]}, nil
}

// postgresCPUSeconds is the CPU time the whole PostgreSQL server has used:
// every live postgres process (the postmaster, its backends and helpers)
// plus what the postmaster's exited children used (its cutime and cstime),
// so a backend that exits between two readings is not lost. Like Redis's
// INFO cpu, it includes whatever else uses the server meanwhile.
func postgresCPUSeconds() (float64, error) {
	paths, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	procs := map[int]procStat{} // the postgres processes, by pid
	for _, p := range paths {
		st, err := readStat(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // exited meanwhile
			}
			return 0, err
		}
		if st.comm == "postgres" {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			procs[pid] = st
		}
	}
	if len(procs) == 0 {
		return 0, errors.New("no postgres process found for the CPU split")
	}
	var ticks uint64
	for _, st := range procs {
		ticks += st.utime + st.stime
		if _, child := procs[st.ppid]; !child {
			ticks += st.cutime + st.cstime // the postmaster
		}
	}
	return float64(ticks) / clockTicks, nil
}
