package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/state"
)

// Resolution is one hand settlement of a record: who, why, as what, when.
type Resolution struct {
	Actor  string
	Reason string
	State  state.RecordState
	Status int
	At     time.Time
}

// ResolveAs is Resolve by a named person with a reason: the settlement and
// its record_resolution row are one transaction (docs/design.md §10's audit:
// `ops resolve` requires --as and --reason).
func (s *Store) ResolveAs(ctx context.Context, key string, c state.Completion, actor, reason string) (state.Answer, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Answer{}, err
	}
	if err := c.Validate(); err != nil {
		return state.Answer{}, err
	}
	if strings.TrimSpace(actor) == "" || strings.TrimSpace(reason) == "" {
		return state.Answer{}, fmt.Errorf("%w: a resolution needs an actor and a reason", state.ErrInvalidArgument)
	}
	status, headers, body, err := resultParams(c)
	if err != nil {
		return state.Answer{}, err
	}
	var ans state.Answer
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		rec, err := scanRecord(tx.QueryRow(ctx, resolveSQL, key, string(c.State), status, headers, body, micros(c.Retention), c.Result.Ref))
		if errors.Is(err, pgx.ErrNoRows) {
			rec, err = scanRecord(tx.QueryRow(ctx, selectSQL, key))
			if errors.Is(err, pgx.ErrNoRows) {
				ans = state.Answer{Outcome: state.OutcomeNotFound}
				return nil
			}
			if err != nil {
				return err
			}
			ans = state.Answer{Outcome: state.OutcomeNotOwner, Record: rec}
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO record_resolution (idem_key, actor, reason, state, result_status)
VALUES ($1::char(32), $2, $3, $4, $5)`, key, actor, reason, string(c.State), status); err != nil {
			return err
		}
		ans = state.Answer{Outcome: state.OutcomeOK, Record: rec}
		return nil
	})
	if err != nil {
		return state.Answer{}, state.Unavailable("resolve in postgres", err)
	}
	return ans, nil
}

// Resolutions lists the hand settlements of key, oldest first.
func (s *Store) Resolutions(ctx context.Context, key string) ([]Resolution, error) {
	rows, err := s.pool.Query(ctx, `SELECT actor, reason, state, result_status, at FROM record_resolution
WHERE idem_key = $1::char(32) ORDER BY resolution_id`, key)
	if err != nil {
		return nil, state.Unavailable("read resolutions in postgres", err)
	}
	defer rows.Close()
	var out []Resolution
	for rows.Next() {
		var r Resolution
		var st string
		if err := rows.Scan(&r.Actor, &r.Reason, &st, &r.Status, &r.At); err != nil {
			return nil, state.Unavailable("read resolutions in postgres", err)
		}
		r.State = state.RecordState(st)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, state.Unavailable("read resolutions in postgres", err)
	}
	return out, nil
}
