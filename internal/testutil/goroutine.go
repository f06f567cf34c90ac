package testutil

import (
	"runtime"
	"testing"
)

// OffTestGoroutine wraps t for a goroutine other than the test's, where
// FailNow (and so require.* and t.Fatal) must not be called: a failure marks
// the test failed and ends only the calling goroutine (runtime.Goexit runs
// its deferred calls, so a WaitGroup's Done still happens). Everything else
// goes to t, whose Error/Log/Cleanup methods are safe from any goroutine.
func OffTestGoroutine(t testing.TB) testing.TB { return goroutineTB{t} }

type goroutineTB struct{ testing.TB }

func (g goroutineTB) FailNow() {
	g.TB.Fail()
	runtime.Goexit()
}

func (g goroutineTB) Fatal(args ...any) {
	g.TB.Helper()
	g.TB.Error(args...)
	runtime.Goexit()
}

func (g goroutineTB) Fatalf(format string, args ...any) {
	g.TB.Helper()
	g.TB.Errorf(format, args...)
	runtime.Goexit()
}
