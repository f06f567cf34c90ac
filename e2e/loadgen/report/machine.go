package report

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes where the numbers were taken.
type Machine struct {
	CPU       string
	Cores     int // logical CPUs the kernel lists
	GoMaxProc int
	Memory    string
	Kernel    string
	Go        string
	Redis     string
	Postgres  string
	Envoy     string // version (the .envoy-version pin), when Envoy ran
	// LoadAverage is /proc/loadavg at the start of the run: other work on a
	// shared machine shows here.
	LoadAverage string
	Commit      string
}

// DescribeMachine reads CPU, memory, kernel and load from /proc; the
// service versions and commit are filled in by the caller.
func DescribeMachine() Machine {
	m := Machine{Go: runtime.Version(), GoMaxProc: runtime.GOMAXPROCS(0), Cores: runtime.NumCPU()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPU, m.Cores = parseCPUInfo(data, m.Cores)
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		if kb, ok := meminfoKB(data, "MemTotal"); ok {
			m.Memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) >= 3 {
			m.LoadAverage = strings.Join(f[:3], " ")
		}
	}
	return m
}

// parseCPUInfo returns the model name and the number of processors listed.
func parseCPUInfo(data []byte, fallback int) (model string, cores int) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			if model == "" {
				model = strings.TrimSpace(v)
			}
		case "processor":
			cores++
		}
	}
	if cores == 0 {
		cores = fallback
	}
	return model, cores
}

// meminfoKB returns a /proc/meminfo or /proc/<pid>/status field in kB.
func meminfoKB(data []byte, field string) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != field {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			return 0, false
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		return n, err == nil
	}
	return 0, false
}

// ResidentBytes reads VmRSS of process pid from /proc/<pid>/status.
func ResidentBytes(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("failed to read the status of process %d: %w", pid, err)
	}
	kb, ok := meminfoKB(data, "VmRSS")
	if !ok {
		return 0, fmt.Errorf("process %d has no VmRSS", pid)
	}
	return kb * 1024, nil
}

func (m Machine) writeMarkdown(b *strings.Builder) {
	row := func(k, v string) {
		if v == "" {
			v = "unknown"
		}
		fmt.Fprintf(b, "| %s | %s |\n", k, escape(v))
	}
	b.WriteString("| | |\n|---|---|\n")
	row("CPU", m.CPU)
	row("cores", fmt.Sprintf("%d (GOMAXPROCS %d in the load tool and in every server)", m.Cores, m.GoMaxProc))
	row("memory", m.Memory)
	row("kernel", m.Kernel)
	row("Go", m.Go)
	row("Redis", m.Redis)
	row("PostgreSQL", m.Postgres)
	if m.Envoy != "" {
		row("Envoy", m.Envoy)
	}
	row("load average at start", m.LoadAverage)
	row("commit", m.Commit)
}
