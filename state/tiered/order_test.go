package tiered_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/statetest"
	"github.com/idemgate/idemgate/state/tiered"
)

// errTruthDown stands for PostgreSQL failing one call (a cut connection, a
// deadline): the store in front of it is the real one, only the terminal
// writes are refused.
var errTruthDown = errors.New("postgres: connection reset (injected)")

// truthRefusingWrites delegates to the real PostgreSQL store but fails every
// call that would write a terminal state.
type truthRefusingWrites struct{ state.Store }

func (truthRefusingWrites) Complete(context.Context, state.Claim, state.Completion) (state.Answer, error) {
	return state.Answer{}, errTruthDown
}

func (truthRefusingWrites) MarkUnknown(context.Context, state.Claim) (state.Answer, error) {
	return state.Answer{}, errTruthDown
}

func (truthRefusingWrites) Resolve(context.Context, string, state.Completion) (state.Answer, error) {
	return state.Answer{}, errTruthDown
}

// TestTerminalStatesReachPostgresBeforeRedis holds the rule "PostgreSQL is the
// truth: terminal states are written to PostgreSQL first, then Redis". When
// the PostgreSQL write fails, Redis must not hold the terminal state: a Redis
// DONE that PostgreSQL never got would be replayed to the next retry (Redis
// terminal answers are not checked against PostgreSQL), and lost for good at
// the next flush. A store that wrote Redis first fails here.
func TestTerminalStatesReachPostgresBeforeRedis(t *testing.T) {
	writes := map[string]func(ctx context.Context, s state.Store, claim state.Claim) (state.Answer, error){
		"complete": func(ctx context.Context, s state.Store, claim state.Claim) (state.Answer, error) {
			return s.Complete(ctx, claim, statetest.Done())
		},
		"mark unknown": func(ctx context.Context, s state.Store, claim state.Claim) (state.Answer, error) {
			return s.MarkUnknown(ctx, claim)
		},
		"resolve": func(ctx context.Context, s state.Store, claim state.Claim) (state.Answer, error) {
			return s.Resolve(ctx, claim.Key, statetest.Done())
		},
	}
	e := newEnv(t)
	for name, write := range writes {
		t.Run(name, func(t *testing.T) {
			rs := newRedis(t, e.redisSrv.Addr)
			s := newTiered(t, tiered.Options{Redis: rs, Postgres: truthRefusingWrites{newPostgres(t, e.dsn)}})
			ctx := t.Context()
			key := statetest.NewKey(t)
			a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-a"))
			statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)

			_, err = write(ctx, s, state.Claim{Key: key, Owner: "owner-a", Fence: a.Record.Fence})
			require.ErrorIs(t, err, state.ErrUnavailable, "a failed PostgreSQL write is reported as unavailable")

			rec, found, err := rs.Get(ctx, key)
			require.NoError(t, err)
			require.True(t, found, "the Redis claim is still there")
			require.Equal(t, state.InFlight, rec.State,
				"Redis got a terminal state that PostgreSQL refused: the terminal write went to Redis first")
			require.Nil(t, rec.Result)

			again, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-b"))
			statetest.RequireOutcome(t, state.OutcomeInFlight, again, err)
		})
	}
}
