package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/state"
)

// Approvals (docs/design.md §10). Every change runs in one transaction that
// first locks the approval row (SELECT … FOR UPDATE), so decisions and
// consumption are serialised per approval; AcquireApproved inserts the
// IN_FLIGHT record and marks the approval CONSUMED in that same
// transaction, so neither exists without the other. An open approval past
// expires_at (judged by now()) is marked EXPIRED by the first call that
// reads it, with its event.

var _ state.Approvals = (*Store)(nil)

const approvalCols = `approval_id, idem_key, operation, scope, subject_tag, requester, param_hash, params, rules,
	required, distinct_from_requester, state, created_at, updated_at, expires_at`

const (
	insertApprovalSQL = `INSERT INTO approval (` + approvalCols + `)
VALUES ($1, $2::char(32), $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, 'PENDING', now(), now(), $12)
ON CONFLICT (idem_key) DO NOTHING`

	insertEventSQL = `INSERT INTO approval_event (approval_id, kind, actor, reason, param_hash, at, acr, amr, auth_time)
VALUES ($1, $2, $3, $4, $5, coalesce($6, now()), $7, $8::jsonb, $9)`

	selectEventsSQL = `SELECT kind, actor, reason, param_hash, at, acr, amr, auth_time FROM approval_event
WHERE approval_id = $1 ORDER BY event_id`

	// lapseSQL marks open approvals past expires_at EXPIRED with their
	// event and returns the operation of each one it marked (for
	// OnApprovalLapse); %s is the condition naming which.
	lapseSQL = `WITH lapsed AS (
	UPDATE approval SET state = 'EXPIRED', updated_at = now()
	WHERE %s AND state IN ('PENDING', 'APPROVED') AND expires_at <= now()
	RETURNING approval_id, operation),
noted AS (INSERT INTO approval_event (approval_id, kind, actor) SELECT approval_id, 'expired', 'idemgate' FROM lapsed)
SELECT operation FROM lapsed`
)

var (
	lapseByIDSQL  = fmt.Sprintf(lapseSQL, "approval_id = $1")
	lapseByKeySQL = fmt.Sprintf(lapseSQL, "idem_key = $1::char(32)")
	lapseAllSQL   = fmt.Sprintf(lapseSQL, "true")
)

// readApproval and loadEvents take a querier (partitions.go): a pool or a
// transaction.

func scanApproval(row pgx.Row) (state.Approval, error) {
	var (
		a      state.Approval
		params string
		rules  []byte
		st     string
	)
	if err := row.Scan(&a.ID, &a.Key, &a.Operation, &a.Scope, &a.SubjectTag, &a.Requester, &a.ParamHash, &params, &rules,
		&a.Required, &a.DistinctFromRequester, &st, &a.CreatedAt, &a.UpdatedAt, &a.ExpiresAt); err != nil {
		return state.Approval{}, err
	}
	a.Params = []byte(params)
	a.State = state.ApprovalState(st)
	if err := json.Unmarshal(rules, &a.Rules); err != nil {
		return state.Approval{}, fmt.Errorf("approval %s: bad rules: %w", a.ID, err)
	}
	return a, nil
}

func loadEvents(ctx context.Context, q querier, a *state.Approval) error {
	rows, err := q.Query(ctx, selectEventsSQL, a.ID)
	if err != nil {
		return err
	}
	defer rows.Close()
	a.Events = nil
	for rows.Next() {
		var e state.ApprovalEvent
		var amr []byte
		var authTime *time.Time
		if err := rows.Scan(&e.Kind, &e.Actor, &e.Reason, &e.ParamHash, &e.At, &e.ACR, &amr, &authTime); err != nil {
			return err
		}
		if err := json.Unmarshal(amr, &e.AMR); err != nil {
			return fmt.Errorf("approval %s: bad amr: %w", a.ID, err)
		}
		if len(e.AMR) == 0 {
			e.AMR = nil
		}
		if authTime != nil {
			e.AuthTime = *authTime
		}
		a.Events = append(a.Events, e)
	}
	return rows.Err()
}

// OnApprovalLapse sets fn to be told the operation of each approval this
// store marks EXPIRED, once, after the marking committed (serve counts
// them in idemgate_approval_transitions_total). Set it before use.
func (s *Store) OnApprovalLapse(fn func(operation string)) { s.onLapse = fn }

// noteLapsed reports committed lapses.
func (s *Store) noteLapsed(ops []string) {
	if s.onLapse == nil {
		return
	}
	for _, op := range ops {
		s.onLapse(op)
	}
}

// lapseWith runs a lapse statement, appending the operations of the
// approvals it marked to lapsed.
func lapseWith(ctx context.Context, q querier, sql string, lapsed *[]string, args ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var ops []string
	for rows.Next() {
		var op string
		if err := rows.Scan(&op); err != nil {
			return err
		}
		ops = append(ops, op)
	}
	if err := rows.Err(); err != nil {
		return err // the statement failed: nothing was marked
	}
	*lapsed = append(*lapsed, ops...)
	return nil
}

// readApproval lapses and reads one approval (where is "approval_id = $1"
// or "idem_key = $1::char(32)"), with its events; lock adds FOR UPDATE.
// The operations of the approvals it lapsed are appended to lapsed: the
// caller reports them once they are committed.
func readApproval(ctx context.Context, q querier, byKey bool, arg string, lock bool, lapsed *[]string) (state.Approval, bool, error) {
	lapse, where := lapseByIDSQL, "approval_id = $1"
	if byKey {
		lapse, where = lapseByKeySQL, "idem_key = $1::char(32)"
	}
	if err := lapseWith(ctx, q, lapse, lapsed, arg); err != nil {
		return state.Approval{}, false, err
	}
	sql := `SELECT ` + approvalCols + ` FROM approval WHERE ` + where
	if lock {
		sql += ` FOR UPDATE`
	}
	a, err := scanApproval(q.QueryRow(ctx, sql, arg))
	if errors.Is(err, pgx.ErrNoRows) {
		return state.Approval{}, false, nil
	}
	if err != nil {
		return state.Approval{}, false, err
	}
	if err := loadEvents(ctx, q, &a); err != nil {
		return state.Approval{}, false, err
	}
	return a, true, nil
}

// inTx runs fn in a transaction, committing when it returns nil.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// RequestApproval implements state.Approvals.
func (s *Store) RequestApproval(ctx context.Context, req state.ApprovalRequest) (state.Approval, bool, error) {
	if err := req.Validate(); err != nil {
		return state.Approval{}, false, err
	}
	rules, err := json.Marshal(append([]string{}, req.Rules...))
	if err != nil {
		return state.Approval{}, false, err
	}
	var (
		a       state.Approval
		created bool
		lapsed  []string
	)
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		lapsed = nil
		tag, err := tx.Exec(ctx, insertApprovalSQL, req.ID, req.Key, req.Operation, req.Scope, req.SubjectTag, req.Requester,
			req.ParamHash, string(req.Params), string(rules), req.Required, req.DistinctFromRequester, req.ExpiresAt)
		if err != nil {
			return err
		}
		if created = tag.RowsAffected() == 1; created {
			if _, err := tx.Exec(ctx, insertEventSQL, req.ID, state.EventRequested, req.Requester, "", req.ParamHash, nil, "", "[]", nil); err != nil {
				return err
			}
			if err := lockBudgets(ctx, tx, req.Spends); err != nil {
				return err
			}
			if err := writeSpends(ctx, tx, req.Key, req.Spends); err != nil {
				return err
			}
		}
		var found bool
		a, found, err = readApproval(ctx, tx, true, req.Key, false, &lapsed)
		if err == nil && !found {
			err = errors.New("approval vanished between insert and read")
		}
		return err
	})
	if err != nil {
		return state.Approval{}, false, state.Unavailable("request approval in postgres", err)
	}
	s.noteLapsed(lapsed)
	return a, created, nil
}

// ApprovalByKey implements state.Approvals.
func (s *Store) ApprovalByKey(ctx context.Context, key string) (state.Approval, bool, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Approval{}, false, err
	}
	var lapsed []string
	a, found, err := readApproval(ctx, s.pool, true, key, false, &lapsed)
	s.noteLapsed(lapsed) // each statement on the pool commits by itself
	if err != nil {
		return state.Approval{}, false, state.Unavailable("read approval in postgres", err)
	}
	return a, found, nil
}

// GetApproval implements state.Approvals.
func (s *Store) GetApproval(ctx context.Context, id string) (state.Approval, bool, error) {
	var lapsed []string
	a, found, err := readApproval(ctx, s.pool, false, id, false, &lapsed)
	s.noteLapsed(lapsed)
	if err != nil {
		return state.Approval{}, false, state.Unavailable("read approval in postgres", err)
	}
	return a, found, nil
}

// ListApprovals implements state.Approvals.
func (s *Store) ListApprovals(ctx context.Context, f state.ApprovalFilter) ([]state.Approval, error) {
	var lapsed []string
	err := lapseWith(ctx, s.pool, lapseAllSQL, &lapsed)
	s.noteLapsed(lapsed)
	if err != nil {
		return nil, state.Unavailable("list approvals in postgres", err)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.pool.Query(ctx, `SELECT `+approvalCols+` FROM approval
WHERE ($1 = '' OR state = $1) ORDER BY created_at, approval_id LIMIT $2`, string(f.State), limit)
	if err != nil {
		return nil, state.Unavailable("list approvals in postgres", err)
	}
	var out []state.Approval
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			rows.Close()
			return nil, state.Unavailable("list approvals in postgres", err)
		}
		out = append(out, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, state.Unavailable("list approvals in postgres", err)
	}
	for i := range out {
		if err := loadEvents(ctx, s.pool, &out[i]); err != nil {
			return nil, state.Unavailable("list approvals in postgres", err)
		}
	}
	return out, nil
}

// DecideApproval implements state.Approvals: the rules (state.DecideOn)
// run on the row locked for the transaction.
func (s *Store) DecideApproval(ctx context.Context, d state.Decision) (state.DecisionOutcome, state.Approval, error) {
	if err := d.Validate(); err != nil {
		return "", state.Approval{}, err
	}
	var (
		out    state.DecisionOutcome
		a      state.Approval
		lapsed []string
	)
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var found bool
		var err error
		lapsed = nil
		a, found, err = readApproval(ctx, tx, false, d.ID, true, &lapsed)
		if err != nil {
			return err
		}
		if !found {
			out = state.DecisionNotFound
			return nil
		}
		before, was := len(a.Events), a.State
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		out = state.DecideOn(&a, d, now)
		for _, e := range a.Events[before:] {
			amr, err := json.Marshal(append([]string{}, e.AMR...))
			if err != nil {
				return err
			}
			var authTime *time.Time
			if !e.AuthTime.IsZero() {
				authTime = &e.AuthTime
			}
			if _, err := tx.Exec(ctx, insertEventSQL, a.ID, e.Kind, e.Actor, e.Reason, e.ParamHash, e.At, e.ACR, string(amr), authTime); err != nil {
				return err
			}
		}
		if a.State != was || len(a.Events) != before {
			if _, err := tx.Exec(ctx, `UPDATE approval SET state = $2, updated_at = now() WHERE approval_id = $1`, a.ID, string(a.State)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return "", state.Approval{}, state.Unavailable("decide approval in postgres", err)
	}
	s.noteLapsed(lapsed)
	return out, a, nil
}

// AcquireApproved implements state.Approvals: the approval row is locked,
// checked, the record inserted and the approval consumed in one
// transaction.
func (s *Store) AcquireApproved(ctx context.Context, req state.AcquireRequest, approvalID string) (state.ApprovedAnswer, error) {
	if err := req.Validate(); err != nil {
		return state.ApprovedAnswer{}, err
	}
	var out state.ApprovedAnswer
	raced := false
	var lapsed []string
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		lapsed = nil
		a, found, err := readApproval(ctx, tx, false, approvalID, true, &lapsed)
		if err != nil || !found {
			return err
		}
		out.Approval = a
		if !state.Grants(&a, req) {
			return nil
		}
		var inserted bool
		rec, err := scanRecord(tx.QueryRow(ctx, acquireSQL, s.acquireArgs(req)...), &inserted)
		if errors.Is(err, pgx.ErrNoRows) {
			raced = true // a concurrent insert committed after the snapshot
			return nil
		}
		if err != nil {
			return err
		}
		ans := state.Answer{Outcome: state.OutcomeOf(rec.State), Record: rec}
		switch {
		case inserted:
			ans.Outcome = state.OutcomeAcquired
			if _, err := tx.Exec(ctx, `UPDATE approval SET state = 'CONSUMED', updated_at = now() WHERE approval_id = $1`, a.ID); err != nil {
				return err
			}
			// The execution counts toward daily totals on its own day.
			if _, err := tx.Exec(ctx, `UPDATE budget_spend SET day = `+utcToday+` WHERE idem_key = $1::char(32)`, req.Key); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, insertEventSQL, a.ID, state.EventConsumed, req.Owner, "", req.ParamHash, nil, "", "[]", nil); err != nil {
				return err
			}
			if err := loadEvents(ctx, tx, &out.Approval); err != nil {
				return err
			}
			out.Approval.State = state.ApprovalConsumed
		case rec.ParamHash != req.ParamHash:
			ans.Outcome = state.OutcomeParamMismatch
		}
		out.Answer = &ans
		return nil
	})
	if err != nil {
		return state.ApprovedAnswer{}, state.Unavailable("acquire approved in postgres", err)
	}
	s.noteLapsed(lapsed)
	if raced {
		// Nothing was consumed; what is there answers.
		rec, found, err := s.get(ctx, req.Key)
		if err != nil || !found {
			return state.ApprovedAnswer{}, state.Unavailable("acquire approved in postgres", errors.Join(err, errors.New("record vanished after an insert conflict")))
		}
		ans := state.Answer{Outcome: state.OutcomeOf(rec.State), Record: rec}
		if rec.ParamHash != req.ParamHash {
			ans.Outcome = state.OutcomeParamMismatch
		}
		out.Answer = &ans
	}
	return out, nil
}

// RecordNotified implements state.Approvals.
func (s *Store) RecordNotified(ctx context.Context, id, actor string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `INSERT INTO approval_event (approval_id, kind, actor)
SELECT approval_id, 'notified', $2 FROM approval WHERE approval_id = $1`, id, actor)
	if err != nil {
		return false, state.Unavailable("record notified in postgres", err)
	}
	return tag.RowsAffected() == 1, nil
}

// utcToday is the current UTC day by the database clock.
const utcToday = `(now() AT TIME ZONE 'UTC')::date`

// lockBudgets serialises, until the transaction ends, everyone who sums or
// adds to these budgets (in a fixed order, so two confirms never wait on
// each other in a cycle).
func lockBudgets(ctx context.Context, tx pgx.Tx, spends []state.Spend) error {
	keys := make([]string, 0, len(spends))
	for _, sp := range spends {
		keys = append(keys, sp.Operation+"\n"+sp.Budget)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, k); err != nil {
			return err
		}
	}
	return nil
}

// writeSpends records what key adds to its budgets, counted today.
func writeSpends(ctx context.Context, tx pgx.Tx, key string, spends []state.Spend) error {
	for _, sp := range spends {
		if _, err := tx.Exec(ctx, `INSERT INTO budget_spend (idem_key, operation, budget, day, amount)
VALUES ($1::char(32), $2, $3, `+utcToday+`, $4::numeric)
ON CONFLICT (idem_key, budget) DO UPDATE SET day = excluded.day`, key, sp.Operation, sp.Budget, sp.Amount); err != nil {
			return err
		}
	}
	return nil
}

// budgetExceededSQL says whether today's total of a budget plus $3 is
// strictly greater than $4.
const budgetExceededSQL = `SELECT coalesce(sum(s.amount), 0) + $3::numeric > $4::numeric
FROM budget_spend s
LEFT JOIN idempotency_record r ON r.idem_key = s.idem_key
LEFT JOIN approval a ON a.idem_key = s.idem_key
WHERE s.operation = $1 AND s.budget = $2 AND s.day = ` + utcToday + `
	AND (r.state IN ('IN_FLIGHT', 'DONE', 'UNKNOWN')
		OR (r.idem_key IS NULL AND a.state IN ('PENDING', 'APPROVED') AND a.expires_at > now()))`

// AcquireWithinBudget implements state.Approvals.
func (s *Store) AcquireWithinBudget(ctx context.Context, req state.AcquireRequest, spends []state.Spend) (state.BudgetAnswer, error) {
	if err := req.Validate(); err != nil {
		return state.BudgetAnswer{}, err
	}
	for _, sp := range spends {
		if err := sp.Validate(); err != nil {
			return state.BudgetAnswer{}, err
		}
	}
	var out state.BudgetAnswer
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if err := lockBudgets(ctx, tx, spends); err != nil {
			return err
		}
		rec, err := scanRecord(tx.QueryRow(ctx, selectSQL, req.Key))
		switch {
		case err == nil:
			ans := state.Answer{Outcome: state.OutcomeOf(rec.State), Record: rec}
			if rec.ParamHash != req.ParamHash {
				ans.Outcome = state.OutcomeParamMismatch
			}
			out.Answer = &ans
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		for i, sp := range spends {
			var exceeded bool
			if err := tx.QueryRow(ctx, budgetExceededSQL, sp.Operation, sp.Budget, sp.Amount, sp.Over).Scan(&exceeded); err != nil {
				return err
			}
			if exceeded {
				out.Exceeded = append(out.Exceeded, i)
			}
		}
		if len(out.Exceeded) > 0 {
			return nil
		}
		var inserted bool
		rec, err = scanRecord(tx.QueryRow(ctx, acquireSQL, s.acquireArgs(req)...), &inserted)
		if err != nil {
			return err // a concurrent insert of the nonce: the retry reads it
		}
		ans := state.Answer{Outcome: state.OutcomeOf(rec.State), Record: rec}
		switch {
		case inserted:
			ans.Outcome = state.OutcomeAcquired
			if err := writeSpends(ctx, tx, req.Key, spends); err != nil {
				return err
			}
		case rec.ParamHash != req.ParamHash:
			ans.Outcome = state.OutcomeParamMismatch
		}
		out.Answer = &ans
		return nil
	})
	if err != nil {
		return state.BudgetAnswer{}, state.Unavailable("acquire within budget in postgres", err)
	}
	return out, nil
}

// acquireArgs are acquireSQL's parameters for req (as Acquire passes them).
func (s *Store) acquireArgs(req state.AcquireRequest) []any {
	var expiry *time.Time
	if !req.FingerprintExpiry.IsZero() {
		e := req.FingerprintExpiry.UTC()
		expiry = &e
	}
	return []any{req.Key, req.Scope, req.SubjectTag, req.ParamHash, req.Owner, micros(req.Lease), micros(req.Retention), expiry, s.aheadDays()}
}
