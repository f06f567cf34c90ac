package redis

import (
	"context"
	"errors"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/state/internal/batch"
)

// Script calls that arrive together share one Redis round trip: they are
// sent as one pipeline (state/internal/batch gathers them: a lone call is
// sent at once, callers' contexts are honoured, a call whose caller left
// before it was sent is not sent). Every call is one script on one key, so
// nothing about a call's atomicity changes: Redis runs pipelined scripts one
// after the other, each whole. A pipeline saves each call its own write and
// read on both ends, which on a machine whose cores are shared by the
// gateway, Redis and PostgreSQL is most of what a call costs.
//
// Failures keep the meaning they have for a single call: the client does
// not retry (MaxRetries -1; NoRetry commands for the Cluster client), a reply lost with its connection is an error
// for every call in the pipeline, and a script the server does not know
// (NOSCRIPT: not run) is run again on its own with EVAL.

// BatchOptions tune the pipelining (see Options.Batch).
type BatchOptions struct {
	// Disabled sends every call on its own.
	Disabled bool
	// MaxItems caps the calls of one pipeline (default 64).
	MaxItems int
	// MaxWait bounds how long a call waits for others while a pipeline is
	// already in flight (default 100µs: a Redis round trip is short).
	MaxWait time.Duration
	// InFlight is how many pipelines may be in flight at once (default 2).
	InFlight int
}

// DefaultBatchMaxWait is the Redis pipelines' MaxWait.
const DefaultBatchMaxWait = 100 * time.Microsecond

// pipelineGrace lets a pipeline run this long past its latest caller's
// deadline before its own context ends (and with it, its connection).
const pipelineGrace = 100 * time.Millisecond

// errRunAlone tells a caller to send its call on its own.
var errRunAlone = errors.New("run the script call on its own")

// scriptCall is one queued script call.
type scriptCall struct {
	script *goredis.Script
	key    string
	args   []any
}

type pipeliner struct {
	c goredis.UniversalClient
	q *batch.Queue[scriptCall, any]
}

func newPipeliner(c goredis.UniversalClient, opts BatchOptions) *pipeliner {
	if opts.MaxWait <= 0 {
		opts.MaxWait = DefaultBatchMaxWait
	}
	p := &pipeliner{c: c}
	p.q = batch.New(batch.Options{MaxItems: opts.MaxItems, MaxWait: opts.MaxWait, InFlight: opts.InFlight, Grace: pipelineGrace}, p.send)
	return p
}

// run runs sc on key through a pipeline, or alone when it must.
func (p *pipeliner) run(ctx context.Context, sc *goredis.Script, key string, args ...any) (any, error) {
	v, err := p.q.Do(ctx, scriptCall{script: sc, key: key, args: args})
	if errors.Is(err, errRunAlone) {
		return runScript(ctx, p.c, sc, key, args...)
	}
	return v, err
}

func (p *pipeliner) send(ctx context.Context, calls []*batch.Call[scriptCall, any]) {
	pipe := p.c.Pipeline()
	cmds := make([]noRetryCmd, len(calls))
	for i, c := range calls {
		cmds[i] = scriptCmd(ctx, c.In.script, false, c.In.key, c.In.args)
		_ = pipe.Process(ctx, cmds[i])
	}
	// Exec's error is the first command's; each command carries its own.
	_, _ = pipe.Exec(ctx)
	for i, c := range calls {
		v, err := cmds[i].Result()
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			c.Finish(nil, errRunAlone)
			continue
		}
		c.Finish(v, err)
	}
}

func (p *pipeliner) close() { p.q.Close() }
