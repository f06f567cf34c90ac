-- Human approval bound to the fingerprint (DESIGN section 10). One approval
-- per nonce; it becomes CONSUMED in the transaction that inserts the
-- nonce's IN_FLIGHT record.
CREATE TABLE approval (
    approval_id             text        PRIMARY KEY,
    idem_key                char(32)    NOT NULL UNIQUE,
    operation               text        NOT NULL,
    scope                   text        NOT NULL,
    subject_tag             text        NOT NULL,
    requester               text        NOT NULL,
    param_hash              text        NOT NULL,
    -- the canonical bound params, as the approver is shown them
    params                  text        NOT NULL,
    rules                   jsonb       NOT NULL,
    required                int         NOT NULL CHECK (required > 0),
    distinct_from_requester boolean     NOT NULL,
    state                   text        NOT NULL
        CHECK (state IN ('PENDING', 'APPROVED', 'DENIED', 'EXPIRED', 'CONSUMED')),
    created_at              timestamptz NOT NULL,
    updated_at              timestamptz NOT NULL,
    expires_at              timestamptz NOT NULL
);

-- GET /v1/approvals?state=pending, `idemgate ops approvals list`.
CREATE INDEX approval_state_created_idx ON approval (state, created_at);

-- The audit trail: one row per transition, never changed or deleted.
CREATE TABLE approval_event (
    event_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    approval_id text        NOT NULL REFERENCES approval (approval_id),
    kind        text        NOT NULL
        CHECK (kind IN ('requested', 'notified', 'approved', 'denied', 'expired', 'consumed')),
    actor       text        NOT NULL,
    reason      text        NOT NULL DEFAULT '',
    -- the hash of the params the actor was shown
    param_hash  text        NOT NULL DEFAULT '',
    at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX approval_event_approval_idx ON approval_event (approval_id, event_id);

-- At most one approve per approver of an approval ("counts once").
CREATE UNIQUE INDEX approval_event_one_approve_idx
    ON approval_event (approval_id, actor) WHERE kind = 'approved';

CREATE FUNCTION approval_event_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'approval_event is append-only';
END
$$;

CREATE TRIGGER approval_event_append_only
    BEFORE UPDATE OR DELETE ON approval_event
    FOR EACH ROW EXECUTE FUNCTION approval_event_append_only();

-- daily_total budgets: what each nonce adds to a budget (operation, and the
-- subject tag with the values of the rule's per params) on the UTC day it
-- was counted. A row counts while its nonce's record is IN_FLIGHT, DONE or
-- UNKNOWN, or, without a record, while its approval is PENDING or APPROVED.
CREATE TABLE budget_spend (
    idem_key  char(32) NOT NULL,
    operation text     NOT NULL,
    budget    text     NOT NULL,
    day       date     NOT NULL,
    amount    numeric  NOT NULL,
    PRIMARY KEY (idem_key, budget)
);

CREATE INDEX budget_spend_sum_idx ON budget_spend (operation, budget, day);
