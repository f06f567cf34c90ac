package testutil

import (
	"fmt"
	"sync"
	"testing"
)

// recordingTB notes failures instead of failing the running test.
type recordingTB struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Fail()   { r.mu.Lock(); r.failed = true; r.mu.Unlock() }
func (r *recordingTB) Error(args ...any) {
	r.mu.Lock()
	r.failed, r.msgs = true, append(r.msgs, fmt.Sprint(args...))
	r.mu.Unlock()
}
func (r *recordingTB) Errorf(format string, args ...any) { r.Error(fmt.Sprintf(format, args...)) }

func TestOffTestGoroutineEndsOnlyTheGoroutine(t *testing.T) {
	for name, fail := range map[string]func(testing.TB){
		"FailNow": func(tb testing.TB) { tb.FailNow() },
		"Fatal":   func(tb testing.TB) { tb.Fatal("boom") },
		"Fatalf":  func(tb testing.TB) { tb.Fatalf("boom %d", 1) },
	} {
		t.Run(name, func(t *testing.T) {
			rec := &recordingTB{}
			var wg sync.WaitGroup
			reached := false
			wg.Add(1)
			go func() {
				defer wg.Done() // runs: Goexit runs deferred calls
				fail(OffTestGoroutine(rec))
				reached = true
			}()
			wg.Wait()
			if !rec.failed {
				t.Fatal("the failure was not recorded")
			}
			if reached {
				t.Fatal("the goroutine went on after the failure")
			}
		})
	}
}
