-- One row per idempotency key (the fingerprint nonce). PostgreSQL is the
-- truth: the primary key is what keeps a confirm to one execution when
-- Redis has lost its copy.
CREATE TABLE idempotency_record (
    -- char(32): the nonce is always 32 hex characters. Compare it with a
    -- char(32)/bpchar parameter; a text parameter skips this index.
    idem_key       char(32)    PRIMARY KEY,
    scope          text        NOT NULL,
    subject_tag    text        NOT NULL,
    param_hash     text        NOT NULL,
    state          text        NOT NULL
        CHECK (state IN ('IN_FLIGHT', 'DONE', 'FAILED', 'UNKNOWN')),
    owner          text        NOT NULL,
    fence          bigint      NOT NULL CHECK (fence > 0),
    lease_until    timestamptz NOT NULL,
    result_status  int,
    result_headers jsonb,
    result_body    bytea,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    -- a terminal record always carries the result it replays
    CONSTRAINT idempotency_record_terminal_has_result
        CHECK (state NOT IN ('DONE', 'FAILED') OR result_status IS NOT NULL)
);

-- The sweeper deletes terminal records past retention, oldest first; the
-- partial index holds only the rows it may delete.
CREATE INDEX idempotency_record_sweep_idx
    ON idempotency_record (expires_at)
    WHERE state IN ('DONE', 'FAILED');

-- `idemgate ops list --state UNKNOWN --older-than 10m`.
CREATE INDEX idempotency_record_state_updated_idx
    ON idempotency_record (state, updated_at);
