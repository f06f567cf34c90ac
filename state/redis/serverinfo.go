package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/state"
)

// ErrMisconfigured marks a Redis server that cannot hold idemgate's records
// safely as configured: the store must not serve from it.
var ErrMisconfigured = errors.New("redis server is misconfigured for idemgate")

// ServerInfo is what INFO says about one server (every master in cluster
// mode). INFO rather than CONFIG GET: managed Redis services often block
// CONFIG, never INFO.
type ServerInfo struct {
	// MaxmemoryPolicy is INFO memory's maxmemory_policy.
	MaxmemoryPolicy string
	// ClusterEnabled is INFO cluster's cluster_enabled:1.
	ClusterEnabled bool
}

// Evicts reports whether the policy lets Redis delete keys on its own when
// memory runs out. Every idemgate key has a TTL, so the volatile-* policies
// evict them as readily as allkeys-*: only noeviction keeps a record.
func (i ServerInfo) Evicts() bool { return i.MaxmemoryPolicy != "noeviction" }

// ServerInfo reads INFO memory and INFO cluster from the server (single,
// Sentinel's current master) or from every master (cluster).
func (s *Store) ServerInfo(ctx context.Context) ([]ServerInfo, error) {
	read := func(ctx context.Context, c goredis.UniversalClient) (ServerInfo, error) {
		// INFO's default sections hold memory and cluster on every Redis
		// version (several named sections need Redis 7).
		text, err := c.Info(ctx).Result()
		if err != nil {
			return ServerInfo{}, state.Unavailable("read redis INFO", err)
		}
		return parseInfo(text)
	}
	cc, ok := s.c.(*goredis.ClusterClient)
	if !ok {
		info, err := read(ctx, s.c)
		if err != nil {
			return nil, err
		}
		return []ServerInfo{info}, nil
	}
	var (
		mu  sync.Mutex
		out []ServerInfo
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
		info, err := read(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		out = append(out, info)
		mu.Unlock()
		return nil
	})
	return out, err
}

func parseInfo(text string) (ServerInfo, error) {
	var (
		info          ServerInfo
		policy, clust bool
	)
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch k {
		case "maxmemory_policy":
			info.MaxmemoryPolicy, policy = v, true
		case "cluster_enabled":
			info.ClusterEnabled, clust = v == "1", true
		}
	}
	if !policy || !clust {
		// A server (or proxy) that hides these cannot be judged: fail closed.
		return ServerInfo{}, fmt.Errorf("%w: INFO does not report maxmemory_policy and cluster_enabled", ErrMisconfigured)
	}
	return info, nil
}

// CheckServer judges the servers for a store whose records live only in
// Redis (asRecord: no PostgreSQL behind it) or for the fast path of a
// tiered store. It returns an error wrapping ErrMisconfigured when the
// store must not use them, and warnings for what costs only speed:
//   - mode single (or sentinel) at a cluster node: most keys would answer
//     MOVED, which the tiered store would silently turn into PostgreSQL-only
//     serving and a Redis-only store into failures. Refused either way.
//   - an evicting maxmemory-policy: Redis may forget a DONE record and a
//     Redis-only store would then execute the replay. Refused for a
//     Redis-only store; a warning for a tiered one (PostgreSQL answers what
//     Redis forgot).
func (s *Store) CheckServer(ctx context.Context, asRecord bool) (warnings []string, err error) {
	infos, err := s.ServerInfo(ctx)
	if err != nil {
		return nil, err
	}
	_, isCluster := s.c.(*goredis.ClusterClient)
	for _, info := range infos {
		if info.ClusterEnabled && !isCluster {
			return nil, fmt.Errorf("%w: the server is a Redis Cluster node (cluster_enabled:1) but store.redis.mode is not cluster; set mode: cluster", ErrMisconfigured)
		}
		if !info.Evicts() {
			continue
		}
		msg := fmt.Sprintf("redis maxmemory-policy is %s: when memory runs out Redis deletes keys, idemgate's records among them (every one has a TTL); set maxmemory-policy noeviction", info.MaxmemoryPolicy)
		if asRecord {
			return nil, fmt.Errorf("%w: %s (a Redis-only store would forget completed operations and execute their replays)", ErrMisconfigured, msg)
		}
		warnings = append(warnings, msg+" (PostgreSQL answers what Redis forgets, more slowly)")
		break
	}
	return warnings, nil
}
