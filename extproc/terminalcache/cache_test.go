package terminalcache

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/state"
)

var t0 = time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)

func record(n int, st state.RecordState, body int) state.Record {
	return state.Record{
		Key: fmt.Sprintf("%032x", n), Scope: "payments", SubjectTag: "tag", ParamHash: "hash",
		State: st, Result: &state.Result{Status: 200, Body: []byte(strings.Repeat("x", body))},
		ExpiresAt: t0.Add(time.Hour),
	}
}

func TestKeepsTerminalRecordsUntilTheyExpire(t *testing.T) {
	c := New(1 << 20)
	for _, st := range []state.RecordState{state.Done, state.Failed} {
		rec := record(1, st, 10)
		if !c.Put(rec, t0) {
			t.Fatalf("%s: not kept", st)
		}
		got, ok := c.Get(rec.Key, t0.Add(59*time.Minute))
		if !ok || got.State != st || string(got.Result.Body) != string(rec.Result.Body) || got.ParamHash != "hash" {
			t.Fatalf("%s: Get = %+v, %v", st, got, ok)
		}
	}
	if _, ok := c.Get(record(1, state.Done, 0).Key, t0.Add(time.Hour)); ok {
		t.Fatal("a record is answered at its ExpiresAt: the store has forgotten it by then")
	}
	if c.Len() != 0 {
		t.Fatalf("an expired entry is kept: Len = %d", c.Len())
	}
}

// Whether a kept body is strict JSON is worked out once, when it is kept,
// on the cache's own copy: a replay from memory embeds it without parsing
// it again, and what the caller put is left as it was.
func TestKnowsWhetherAKeptBodyIsJSON(t *testing.T) {
	c := New(1 << 20)
	for i, tc := range []struct {
		body string
		json bool
	}{
		{`{"id":"tr_1"}`, true},
		{` [1, 2] `, true},
		{`{oops`, false},
		{`{"a":1,"a":2}`, false}, // a duplicate name: two parsers, two values
		{"\"\xff\"", false},      // invalid UTF-8
		{"", false},              // nothing to embed: rendered as null
	} {
		rec := record(i+10, state.Done, 0)
		rec.Result.Body = []byte(tc.body)
		if !c.Put(rec, t0) {
			t.Fatalf("%q: not kept", tc.body)
		}
		if rec.Result.BodyJSON {
			t.Fatalf("%q: the caller's result was changed", tc.body)
		}
		got, _ := c.Get(rec.Key, t0)
		if got.Result.BodyJSON != tc.json || string(got.Result.Body) != tc.body {
			t.Fatalf("%q: kept BodyJSON=%v body %q, want %v", tc.body, got.Result.BodyJSON, got.Result.Body, tc.json)
		}
	}
}

func TestRefusesWhatMayStillChange(t *testing.T) {
	c := New(1 << 20)
	for _, st := range []state.RecordState{state.InFlight, state.Unknown, ""} {
		if c.Put(record(2, st, 1), t0) {
			t.Errorf("%q kept: only DONE and FAILED are final", st)
		}
	}
	if c.Put(record(3, state.Done, 1), t0.Add(2*time.Hour)) {
		t.Error("an expired record kept")
	}
	if _, ok := c.Get(record(2, state.Done, 0).Key, t0); ok {
		t.Error("a refused record answered")
	}
}

func TestBoundedInBytesLeastRecentlyUsedFirst(t *testing.T) {
	per := sizeOf(record(0, state.Done, 1000))
	c := New(per * 10)
	for i := range 10 {
		c.Put(record(i, state.Done, 1000), t0)
	}
	c.Get(record(0, state.Done, 0).Key, t0) // 0 is now the most recently used
	c.Put(record(10, state.Done, 1000), t0)
	if c.Len() != 10 || c.used > c.maxBytes {
		t.Fatalf("Len = %d, used = %d of %d", c.Len(), c.used, c.maxBytes)
	}
	if _, ok := c.Get(record(1, state.Done, 0).Key, t0); ok {
		t.Error("the least recently used record (1) was kept")
	}
	for _, n := range []int{0, 2, 10} {
		if _, ok := c.Get(record(n, state.Done, 0).Key, t0); !ok {
			t.Errorf("record %d was evicted", n)
		}
	}
	if c.Put(record(11, state.Done, int(c.maxBytes/8)), t0) {
		t.Error("a record over an eighth of the cache was kept")
	}
	// Put of a key already kept replaces it without double-counting.
	c.Put(record(2, state.Failed, 1000), t0)
	if got, _ := c.Get(record(2, state.Done, 0).Key, t0); got.State != state.Failed || c.used > c.maxBytes || c.Len() != 10 {
		t.Errorf("replacing an entry: state %s, used %d, Len %d", got.State, c.used, c.Len())
	}
}

func TestNilCacheKeepsNothing(t *testing.T) {
	var c *Cache = New(0)
	if c.Put(record(1, state.Done, 1), t0) || c.Len() != 0 {
		t.Fatal("a zero-byte cache kept a record")
	}
	if _, ok := c.Get(record(1, state.Done, 0).Key, t0); ok {
		t.Fatal("a zero-byte cache answered")
	}
}

func TestConcurrentUse(t *testing.T) {
	c := New(sizeOf(record(0, state.Done, 100)) * 50)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 2000 {
				n := (g*7 + i) % 200
				if rec, ok := c.Get(record(n, state.Done, 0).Key, t0); ok && rec.Key != record(n, state.Done, 0).Key {
					t.Errorf("Get(%d) answered %s", n, rec.Key)
					return
				}
				c.Put(record(n, state.Done, 100), t0)
			}
		})
	}
	wg.Wait()
	if c.Len() > 50 || c.used > c.maxBytes {
		t.Fatalf("bound broken: Len %d, used %d of %d", c.Len(), c.used, c.maxBytes)
	}
}
