// Package codec turns stored response headers into JSON and back without
// losing a byte. Redis keeps the JSON in a hash field and PostgreSQL in a
// jsonb column; JSON would replace invalid UTF-8 with U+FFFD and jsonb refuses
// NUL, so a name or value that JSON cannot carry exactly is stored as base64
// in a sibling field instead. Everything else stays readable for operators.
package codec

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/idemgate/idemgate/state"
)

type header struct {
	Name     string `json:"name,omitempty"`
	NameB64  string `json:"name_b64,omitempty"`
	Value    string `json:"value"`
	ValueB64 string `json:"value_b64,omitempty"`
}

func needsBase64(s string) bool {
	return !utf8.ValidString(s) || strings.ContainsRune(s, 0)
}

// EncodeHeaders returns the JSON array stored for hs ("[]" when empty).
func EncodeHeaders(hs []state.Header) ([]byte, error) {
	out := make([]header, 0, len(hs))
	for _, h := range hs {
		var e header
		if needsBase64(h.Name) {
			e.NameB64 = base64.StdEncoding.EncodeToString([]byte(h.Name))
		} else {
			e.Name = h.Name
		}
		if needsBase64(h.Value) {
			e.ValueB64 = base64.StdEncoding.EncodeToString([]byte(h.Value))
		} else {
			e.Value = h.Value
		}
		out = append(out, e)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("failed to encode headers: %w", err)
	}
	return b, nil
}

// DecodeHeaders reverses EncodeHeaders. An empty input or an empty array
// gives nil.
func DecodeHeaders(b []byte) ([]state.Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var in []header
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("failed to decode headers: %w", err)
	}
	if len(in) == 0 {
		return nil, nil
	}
	hs := make([]state.Header, 0, len(in))
	for _, e := range in {
		h := state.Header{Name: e.Name, Value: e.Value}
		if e.NameB64 != "" {
			n, err := base64.StdEncoding.DecodeString(e.NameB64)
			if err != nil {
				return nil, fmt.Errorf("failed to decode header name: %w", err)
			}
			h.Name = string(n)
		}
		if e.ValueB64 != "" {
			v, err := base64.StdEncoding.DecodeString(e.ValueB64)
			if err != nil {
				return nil, fmt.Errorf("failed to decode header value: %w", err)
			}
			h.Value = string(v)
		}
		hs = append(hs, h)
	}
	return hs, nil
}

// maxCachedHeaderSets bounds a Cache: stored header sets repeat (every
// record from one upstream carries the same content-type, perhaps a
// location), so a small cache answers nearly every read.
const maxCachedHeaderSets = 256

// Cache decodes stored headers like DecodeHeaders, remembering the header
// sets it has seen so that the reads on the replay path skip JSON decoding.
// It is safe for concurrent use; the zero value is ready.
type Cache struct {
	mu   sync.RWMutex
	sets map[string][]state.Header
}

// Decode is DecodeHeaders for the stored bytes b. The result is the
// caller's own slice.
func (c *Cache) Decode(b []byte) ([]state.Header, error) {
	c.mu.RLock()
	hs, ok := c.sets[string(b)]
	c.mu.RUnlock()
	if ok {
		return slices.Clone(hs), nil
	}
	hs, err := DecodeHeaders(b)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.sets == nil {
		c.sets = make(map[string][]state.Header)
	}
	if len(c.sets) < maxCachedHeaderSets {
		c.sets[string(b)] = slices.Clone(hs)
	}
	c.mu.Unlock()
	return hs, nil
}

// DecodeString is Decode for a string.
func (c *Cache) DecodeString(s string) ([]state.Header, error) {
	c.mu.RLock()
	hs, ok := c.sets[s]
	c.mu.RUnlock()
	if ok {
		return slices.Clone(hs), nil
	}
	return c.Decode([]byte(s))
}
