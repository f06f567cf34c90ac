package stack

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/idemgate/idemgate/envoy/envoytest"
)

// Envoy is the front of a stack: a real Envoy process (envoytest.Start)
// running the shipped envoy.yaml with only ports, paths and the test's
// timeouts changed. ListenAddr and AdminAddr (loopback, ports chosen by the
// kernel), Admin, Stat, Kill and Stop come from envoytest.Envoy.
type Envoy struct {
	*envoytest.Envoy
	log *LogBuffer
}

// accessLogFlush is --file-flush-interval-msec. The stdout access log is
// where the tests read the x-request-id Envoy gave a request; Envoy's
// default flush interval (10 s) makes every such lookup wait that long, and
// tests that race a lease (6 s in the crash test) then lose the race.
const accessLogFlush = 20 * time.Millisecond

// startEnvoy runs bin on bootstrap. The bootstrap binds the listener and the
// admin interface to port 0, so two Envoys (parallel tests, parallel test
// binaries) can never collide on a port chosen before it was bound;
// envoytest.Start reads the bound ports back. Two worker threads are enough
// for any test.
func startEnvoy(t testing.TB, bin string, bootstrap []byte) (*Envoy, error) {
	f := &Envoy{log: &LogBuffer{}}
	// stdout carries the access log (the shipped stdout access logger),
	// stderr Envoy's own log; both go into the dump of a failed test.
	e, err := envoytest.Start(context.Background(), envoytest.Options{
		Bin: bin, Bootstrap: bootstrap, Dir: t.TempDir(),
		Concurrency: 2, FlushInterval: accessLogFlush,
		Listener: envoytest.IngressListener,
		Stdout:   f.log, Stderr: f.log,
		ReadyTimeout: readyTimeout,
	})
	if err != nil {
		return nil, err
	}
	f.Envoy = e
	go func() {
		<-e.Done()
		fmt.Fprintf(f.log, "=== e2e: envoy exited: %v ===\n", e.Err())
	}()
	return f, nil
}

// Log is everything Envoy wrote so far: its own log and the access log.
func (f *Envoy) Log() string { return f.log.String() }

// Close stops Envoy (SIGTERM, then SIGKILL after 10 s).
func (f *Envoy) Close() { _ = f.Stop(10 * time.Second) }

// accessLogRequestID matches the end of Envoy's default access log format:
// ... "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%".
func accessLogRequestID(userAgent string) *regexp.Regexp {
	return regexp.MustCompile(`"` + regexp.QuoteMeta(userAgent) + `" "([^"]*)"`)
}

// AccessLogLine waits for the access log line of the request sent with the
// unique User-Agent ua and returns it.
func (f *Envoy) AccessLogLine(ua string) (string, error) {
	re := regexp.MustCompile(`(?m)^.*"` + regexp.QuoteMeta(ua) + `".*$`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := re.FindString(f.log.String()); m != "" {
			return m, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no access log line for user-agent %s", ua)
		}
		time.Sleep(accessLogFlush)
	}
}

// RequestID reads the x-request-id Envoy gave the request that got resp
// from its access log line (each agent request has a unique User-Agent).
func (f *Envoy) RequestID(resp *Response) (string, error) {
	line, err := f.AccessLogLine(resp.UserAgent)
	if err != nil {
		return "", err
	}
	m := accessLogRequestID(resp.UserAgent).FindStringSubmatch(line)
	if m == nil {
		return "", fmt.Errorf("access log line has no x-request-id after the user-agent: %s", line)
	}
	return m[1], nil
}
