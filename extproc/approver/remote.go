package approver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// ErrKeysUnavailable is wrapped when a remote JWKS cannot be fetched and no
// copy is cached: nothing can be verified (the caller answers "try again",
// never "valid").
var ErrKeysUnavailable = errors.New("approver keys unavailable")

// Defaults of RemoteJWKS.
const (
	DefaultJWKSCache      = 5 * time.Minute
	DefaultJWKSMinRefresh = 30 * time.Second
	jwksFetchTimeout      = 5 * time.Second
	maxJWKSBytes          = 1 << 20
)

// RemoteJWKS is a JWKS fetched from a URL and cached: refreshed when older
// than Cache, and early (at most once per MinRefresh) when a token names a
// key id the cached set lacks (the IdP rotated). A failed refresh keeps the
// cached set; with nothing cached, verification fails with
// ErrKeysUnavailable.
type RemoteJWKS struct {
	URL        string
	Cache      time.Duration
	MinRefresh time.Duration
	Client     *http.Client
	Now        func() time.Time

	mu      sync.Mutex
	keys    *KeySet
	fetched time.Time // last successful fetch
	tried   time.Time // last attempt
}

func (r *RemoteJWKS) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Keys returns the cached set, refreshing it when stale or when force and
// the last attempt is older than MinRefresh.
func (r *RemoteJWKS) Keys(force bool) (*KeySet, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cache, minRefresh := r.Cache, r.MinRefresh
	if cache <= 0 {
		cache = DefaultJWKSCache
	}
	if minRefresh <= 0 {
		minRefresh = DefaultJWKSMinRefresh
	}
	now := r.now()
	stale := r.keys == nil || now.Sub(r.fetched) >= cache
	if (stale || force) && (r.tried.IsZero() || now.Sub(r.tried) >= minRefresh || r.keys == nil) {
		r.tried = now
		keys, err := r.fetch()
		if err == nil {
			r.keys, r.fetched = keys, now
		} else if r.keys == nil {
			return nil, fmt.Errorf("%w: %w", ErrKeysUnavailable, err)
		}
	}
	if r.keys == nil {
		return nil, fmt.Errorf("%w: not fetched yet", ErrKeysUnavailable)
	}
	return r.keys, nil
}

func (r *RemoteJWKS) fetch() (*KeySet, error) {
	client := r.Client
	if client == nil {
		client = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(context.Background(), jwksFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("failed to fetch %s: %w", r.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("failed to fetch %s: HTTP %d", r.URL, resp.StatusCode)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", r.URL, err)
	}
	if len(data) > maxJWKSBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", r.URL, maxJWKSBytes)
	}
	return ParseJWKS(data)
}
