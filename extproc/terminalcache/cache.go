// Package terminalcache keeps, in one replica's memory, the terminal
// records (DONE, FAILED) its confirms have read from the store, so that an
// agent repeating a confirm it already made (after a timeout it could not
// read, or after its context was compacted) is answered without a store
// round trip, and a retry loop does not land on Redis.
//
// It can hold a copy safely because a terminal record never changes (the
// state package: "DONE | FAILED: final. No call changes them"). A copy can
// only outlive its record, so each entry ends at the record's ExpiresAt,
// when the store forgets it too. Nothing else is kept: IN_FLIGHT and
// UNKNOWN records move, and every other outcome is the store's to give.
//
// The memory is bounded in bytes; the least recently used entries go first.
package terminalcache

import (
	"container/list"
	"sync"
	"time"

	"github.com/idemgate/idemgate/internal/jsonx"
	"github.com/idemgate/idemgate/state"
)

// entryOverhead is what an entry costs beyond its strings and body: the
// Record and Result structs, the list element and the map slot.
const entryOverhead = 320

// Cache is a bounded map from fingerprint nonce to terminal record. A nil
// *Cache keeps nothing: Get misses and Put drops.
type Cache struct {
	maxBytes int64

	mu    sync.Mutex
	used  int64
	byKey map[string]*list.Element
	lru   *list.List // front: most recently used
}

type entry struct {
	rec  state.Record
	size int64
}

// New returns a cache that holds at most maxBytes of records, or nil (a
// cache that keeps nothing) when maxBytes is not positive.
func New(maxBytes int64) *Cache {
	if maxBytes <= 0 {
		return nil
	}
	return &Cache{maxBytes: maxBytes, byKey: make(map[string]*list.Element), lru: list.New()}
}

// Get returns the terminal record kept under key if it has not expired at
// now. The Result is shared with the cache: callers read it, never change
// it.
func (c *Cache) Get(key string, now time.Time) (state.Record, bool) {
	if c == nil {
		return state.Record{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		return state.Record{}, false
	}
	e := el.Value.(*entry)
	if !now.Before(e.rec.ExpiresAt) {
		c.remove(el)
		return state.Record{}, false
	}
	c.lru.MoveToFront(el)
	return e.rec, true
}

// Put keeps rec if it is terminal, has not expired at now, and is no
// larger than an eighth of the cache (one large result must not push out
// every other). It reports whether rec was kept. rec.Result must not be
// changed afterwards.
func (c *Cache) Put(rec state.Record, now time.Time) bool {
	if c == nil || !rec.State.Terminal() || !now.Before(rec.ExpiresAt) {
		return false
	}
	size := sizeOf(rec)
	if size > c.maxBytes/8 {
		return false
	}
	rec.Result = checked(rec.Result)
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[rec.Key]; ok {
		c.remove(el)
	}
	for c.used+size > c.maxBytes {
		c.remove(c.lru.Back())
	}
	c.byKey[rec.Key] = c.lru.PushFront(&entry{rec: rec, size: size})
	c.used += size
	return true
}

// Len is the number of records kept.
func (c *Cache) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

func (c *Cache) remove(el *list.Element) {
	e := c.lru.Remove(el).(*entry)
	delete(c.byKey, e.rec.Key)
	c.used -= e.size
}

// checked returns the copy of r the cache keeps: the same, with BodyJSON
// worked out, so that every replay answered from memory embeds the body
// without parsing it again. The caller's r is not changed (it may be shared).
func checked(r *state.Result) *state.Result {
	if r == nil || r.BodyJSON || len(r.Body) == 0 {
		return r
	}
	c := *r
	c.BodyJSON = jsonx.Check(r.Body) == nil
	return &c
}

func sizeOf(rec state.Record) int64 {
	n := entryOverhead + len(rec.Key) + len(rec.Scope) + len(rec.SubjectTag) + len(rec.ParamHash) + len(rec.Owner)
	if r := rec.Result; r != nil {
		n += len(r.Body) + len(r.Ref)
		for _, h := range r.Headers {
			n += len(h.Name) + len(h.Value) + 32
		}
	}
	return int64(n)
}
