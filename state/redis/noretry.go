package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"
)

// A script whose reply was lost may already have run. Run again, Acquire
// answers IN_FLIGHT to the caller that has just won, and Takeover finds its
// own new fence: the tiered store then asks PostgreSQL, but a Redis-only
// store answers in_progress or unknown for a claim nobody holds. MaxRetries
// -1 stops the single and Sentinel clients from retrying, not the Cluster
// client: it retries network errors up to MaxRedirects times whatever
// MaxRetries says, and only a command that reports NoRetry is exempt (from
// plain and pipelined sends alike). Every script call is sent as one. MOVED
// and ASK redirects are still followed: the script did not run then.

// noRetryCmd is a script command the client must never send twice.
type noRetryCmd struct{ *goredis.Cmd }

func (noRetryCmd) NoRetry() bool { return true }

// scriptCmd builds EVALSHA (or EVAL, by body) of sc on key, marked NoRetry.
func scriptCmd(ctx context.Context, sc *goredis.Script, byBody bool, key string, args []any) noRetryCmd {
	name, payload := "evalsha", sc.Hash()
	if byBody {
		name, payload = "eval", scriptSources[sc]
	}
	cmdArgs := make([]any, 0, 4+len(args))
	cmdArgs = append(cmdArgs, name, payload, 1, key)
	cmdArgs = append(cmdArgs, args...)
	cmd := goredis.NewCmd(ctx, cmdArgs...)
	// The key is the 4th argument: it routes the command to its cluster
	// slot, as EvalSha would.
	cmd.SetFirstKeyPos(3)
	return noRetryCmd{cmd}
}

// runScript runs sc on key once: EVALSHA, then EVAL when the server does
// not know the script (NOSCRIPT: it did not run).
func runScript(ctx context.Context, c goredis.UniversalClient, sc *goredis.Script, key string, args ...any) (any, error) {
	cmd := scriptCmd(ctx, sc, false, key, args)
	err := c.Process(ctx, cmd)
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = scriptCmd(ctx, sc, true, key, args)
		_ = c.Process(ctx, cmd)
	}
	return cmd.Result()
}
