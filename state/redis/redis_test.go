package redis_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/redis"
	"github.com/idemgate/idemgate/state/statetest"
)

func newSingle(t testing.TB, addr string) *redis.Store {
	t.Helper()
	s, err := redis.New(redis.Options{Addrs: []string{addr}, KeyPrefix: "idemtest:"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformanceSingle(t *testing.T) {
	srv := testutil.StartRedis(t)
	statetest.Run(t, func(t *testing.T) state.Store { return newSingle(t, srv.Addr) })
}

func TestConformanceCluster(t *testing.T) {
	addrs := testutil.StartRedisCluster(t, 3)
	statetest.Run(t, func(t *testing.T) state.Store {
		s, err := redis.New(redis.Options{Addrs: addrs, Mode: redis.ModeCluster})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		require.NoError(t, s.LoadScripts(t.Context()))
		return s
	})
}

func TestKeysUseHashTag(t *testing.T) {
	s := redis.NewFromClient(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}), "")
	defer s.Client().Close()
	require.Equal(t, "idem:{0123456789abcdef0123456789abcdef}", s.Key("0123456789abcdef0123456789abcdef"))
}

func TestRecordIsAHashWithTTL(t *testing.T) {
	srv := testutil.StartRedis(t)
	s := newSingle(t, srv.Addr)
	ctx := t.Context()
	key := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	c := statetest.Done()
	c.Retention = 10 * time.Minute
	done, err := s.Complete(ctx, state.Claim{Key: key, Owner: "o", Fence: 1}, c)
	statetest.RequireOutcome(t, state.OutcomeOK, done, err)

	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer raw.Close()
	h, err := raw.HGetAll(ctx, s.Key(key)).Result()
	require.NoError(t, err)
	require.Equal(t, "DONE", h["state"])
	require.Equal(t, "201", h["result_status"])
	require.Equal(t, string(statetest.SampleResult().Body), h["result_body"], "the body is stored as raw bytes")
	ttl, err := raw.PTTL(ctx, s.Key(key)).Result()
	require.NoError(t, err)
	require.InDelta(t, float64(10*time.Minute), float64(ttl), float64(5*time.Second), "key TTL is the retention")
}

func TestScriptsSurviveScriptFlush(t *testing.T) {
	srv := testutil.StartRedis(t)
	s := newSingle(t, srv.Addr)
	ctx := t.Context()
	require.NoError(t, s.LoadScripts(ctx))
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer raw.Close()
	require.NoError(t, raw.ScriptFlush(ctx).Err())
	// EVALSHA now answers NOSCRIPT; Run falls back to EVAL.
	a, err := s.Acquire(ctx, statetest.AcquireRequest(statetest.NewKey(t), "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
}

func TestRepair(t *testing.T) {
	srv := testutil.StartRedis(t)
	s := newSingle(t, srv.Addr)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	key := statetest.NewKey(t)
	res := statetest.SampleResult()
	done := state.Record{
		Key: key, Scope: "payments.transfer", SubjectTag: "subj", ParamHash: "ph-1",
		State: state.Done, Owner: "pg-owner", Fence: 3,
		LeaseUntil: now, CreatedAt: now.Add(-time.Minute), UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
		Result: &res,
	}

	// A fresh claim made in Redis after it lost data is overwritten by the truth.
	a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "redis-owner"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	applied, err := s.Repair(ctx, done, time.Hour)
	require.NoError(t, err)
	require.True(t, applied)
	got, found, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.Done, got.State)
	require.Equal(t, "pg-owner", got.Owner)
	require.Equal(t, int64(3), got.Fence)
	require.Equal(t, done.CreatedAt, got.CreatedAt)
	require.Equal(t, done.ExpiresAt, got.ExpiresAt)
	statetest.RequireSameResult(t, res, got.Result)
	replay, err := s.Acquire(ctx, statetest.AcquireRequest(key, "x"))
	statetest.RequireOutcome(t, state.OutcomeDone, replay, err)
	statetest.RequireSameResult(t, res, replay.Record.Result)

	// A stale non-terminal copy never replaces a terminal record.
	stale := done
	stale.State = state.InFlight
	stale.Result = nil
	applied, err = s.Repair(ctx, stale, time.Hour)
	require.NoError(t, err)
	require.False(t, applied)
	got, _, err = s.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, state.Done, got.State)

	_, err = s.Repair(ctx, done, 0)
	require.ErrorIs(t, err, state.ErrInvalidArgument)
}

func TestDropOrphan(t *testing.T) {
	srv := testutil.StartRedis(t)
	s := newSingle(t, srv.Addr)
	ctx := t.Context()
	key := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)

	deleted, err := s.DropOrphan(ctx, state.Claim{Key: key, Owner: "other", Fence: 1})
	require.NoError(t, err)
	require.False(t, deleted, "someone else's claim is not forgotten")
	deleted, err = s.DropOrphan(ctx, state.Claim{Key: key, Owner: "o", Fence: 2})
	require.NoError(t, err)
	require.False(t, deleted, "a different fence is not forgotten")
	deleted, err = s.DropOrphan(ctx, state.Claim{Key: key, Owner: "o", Fence: 1})
	require.NoError(t, err)
	require.True(t, deleted)
	_, found, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.False(t, found)
	deleted, err = s.DropOrphan(ctx, state.Claim{Key: key, Owner: "o", Fence: 1})
	require.NoError(t, err)
	require.False(t, deleted)

	// A terminal record is never forgotten.
	b, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o2"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, b, err)
	c, err := s.Complete(ctx, state.Claim{Key: key, Owner: "o2", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)
	deleted, err = s.DropOrphan(ctx, state.Claim{Key: key, Owner: "o2", Fence: 1})
	require.NoError(t, err)
	require.False(t, deleted)
}

func TestForeignValueIsAnErrorNotAPanic(t *testing.T) {
	srv := testutil.StartRedis(t)
	s := newSingle(t, srv.Addr)
	ctx := t.Context()
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer raw.Close()
	key := statetest.NewKey(t)
	// A hash under our key that is not one of our records.
	require.NoError(t, raw.HSet(ctx, s.Key(key), "state", "BOGUS", "param_hash", "ph-1").Err())
	_, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
	require.Error(t, err)
	_, _, err = s.Get(ctx, key)
	require.Error(t, err)
	// A string under our key: the script itself fails (WRONGTYPE).
	key2 := statetest.NewKey(t)
	require.NoError(t, raw.Set(ctx, s.Key(key2), "x", 0).Err())
	_, err = s.Acquire(ctx, statetest.AcquireRequest(key2, "o"))
	require.ErrorIs(t, err, state.ErrUnavailable)
}

func TestNewValidatesOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts redis.Options
	}{
		{"no address", redis.Options{}},
		{"single with two addresses", redis.Options{Addrs: []string{"a:1", "b:2"}}},
		{"cluster with db", redis.Options{Addrs: []string{"a:1"}, Mode: redis.ModeCluster, DB: 2}},
		{"sentinel without master", redis.Options{Addrs: []string{"a:1"}, Mode: redis.ModeSentinel}},
		{"unknown mode", redis.Options{Addrs: []string{"a:1"}, Mode: "ring"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := redis.New(tc.opts)
			require.ErrorIs(t, err, state.ErrInvalidArgument)
		})
	}
	for _, mode := range []string{"", redis.ModeSingle, redis.ModeCluster} {
		s, err := redis.New(redis.Options{Addrs: []string{"127.0.0.1:1"}, Mode: mode})
		require.NoError(t, err)
		require.NoError(t, s.Close())
	}
	s, err := redis.New(redis.Options{Addrs: []string{"127.0.0.1:1"}, Mode: redis.ModeSentinel, MasterName: "m"})
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

func TestUnreachableRedisIsUnavailable(t *testing.T) {
	port := testutil.FreePort(t)
	s, err := redis.New(redis.Options{Addrs: []string{"127.0.0.1:" + strconv.Itoa(port)}, DialTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err = s.Acquire(ctx, statetest.AcquireRequest(statetest.NewKey(t), "o"))
	require.ErrorIs(t, err, state.ErrUnavailable)
	require.ErrorIs(t, s.Ping(ctx), state.ErrUnavailable)
}

func TestConformanceSentinel(t *testing.T) {
	master := testutil.StartRedis(t)
	sentinel := testutil.StartRedisSentinel(t, "idemmaster", master.Addr)
	statetest.Run(t, func(t *testing.T) state.Store {
		s, err := redis.New(redis.Options{Addrs: []string{sentinel}, Mode: redis.ModeSentinel, MasterName: "idemmaster"})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// clientCert says whether a client presents the test client certificate.
type clientCert bool

const (
	noClientCert   clientCert = false
	withClientCert clientCert = true
)

// tlsConfig trusts the test CA and, withClientCert, presents the client
// certificate.
func tlsConfig(t *testing.T, files testutil.TLSFiles, present clientCert) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(files.CAFile)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pem))
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if present == withClientCert {
		cert, err := tls.LoadX509KeyPair(files.ClientCertFile, files.ClientKeyFile)
		require.NoError(t, err)
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

func TestConformanceTLS(t *testing.T) {
	srv, files := testutil.StartRedisTLS(t, testutil.RequireClientCerts)
	statetest.Run(t, func(t *testing.T) state.Store {
		s, err := redis.New(redis.Options{Addrs: []string{srv.Addr}, TLS: tlsConfig(t, files, withClientCert)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// A TLS-only Redis refuses plain text, an unknown CA, and (when it asks for
// one) a client without a certificate: each is an unavailable store, which
// the tiered store and /readyz report, never a silent downgrade.
func TestTLSIsRequiredAndVerified(t *testing.T) {
	srv, files := testutil.StartRedisTLS(t, testutil.RequireClientCerts)
	for name, cfg := range map[string]*tls.Config{
		"plain text":             nil,
		"server not trusted":     {MinVersion: tls.VersionTLS12},
		"no client certificate":  tlsConfig(t, files, noClientCert),
		"trusted and identified": tlsConfig(t, files, withClientCert),
	} {
		t.Run(name, func(t *testing.T) {
			s, err := redis.New(redis.Options{Addrs: []string{srv.Addr}, TLS: cfg, DialTimeout: time.Second})
			require.NoError(t, err)
			defer s.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			err = s.Ping(ctx)
			if name == "trusted and identified" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, state.ErrUnavailable)
		})
	}
}
