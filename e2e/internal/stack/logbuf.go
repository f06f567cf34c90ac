package stack

import (
	"bytes"
	"strings"
	"sync"
)

// LogBuffer collects a child process's output for assertions and for the
// dump on failure. Writes may come from several goroutines.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines returns the complete lines that contain every one of parts.
func (b *LogBuffer) Lines(parts ...string) []string {
	var out []string
	for _, line := range strings.Split(b.String(), "\n") {
		match := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				match = false
				break
			}
		}
		if match && line != "" {
			out = append(out, line)
		}
	}
	return out
}
