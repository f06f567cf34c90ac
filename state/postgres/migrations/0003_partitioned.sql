-- Time-partitioned retention. Terminal records leave by whole partitions
-- (DROP TABLE: no per-row DELETE, no dead tuples, almost no WAL) instead of
-- a row-by-row sweep, which at thousands of confirms a second makes the
-- table, its random-key index, vacuum and WAL the bottleneck.
--
-- The partition key must be part of the primary key, so every attempt at
-- one nonce must compute the same key: it is the UTC day of the
-- fingerprint's expiry (exp), which is signed into the token, so every
-- retry of a confirm carries the same one. A record whose expiry is not
-- known (a caller that does not pass it) goes to the held partition, bucket
-- 1970-01-01, swept row by row as before.
--
-- Today's table becomes the held partition: its rows keep their key and
-- stay readable. The lock this takes lasts as long as building the new
-- primary key over the existing rows (README: Operating).
ALTER TABLE idempotency_record RENAME TO idempotency_record_held;
ALTER TABLE idempotency_record_held ADD COLUMN bucket date NOT NULL DEFAULT '1970-01-01';
ALTER TABLE idempotency_record_held DROP CONSTRAINT idempotency_record_pkey;
ALTER TABLE idempotency_record_held ADD CONSTRAINT idempotency_record_held_pkey PRIMARY KEY (idem_key, bucket);
-- Proves the held rows lie in the held range, so ATTACH needs no scan.
ALTER TABLE idempotency_record_held ADD CONSTRAINT idempotency_record_held_bucket CHECK (bucket < DATE '2000-01-01');
ALTER INDEX idempotency_record_sweep_idx RENAME TO idempotency_record_held_sweep_idx;
ALTER INDEX idempotency_record_state_updated_idx RENAME TO idempotency_record_held_state_updated_idx;

CREATE TABLE idempotency_record (
    idem_key       char(32)    NOT NULL,
    scope          text        NOT NULL,
    subject_tag    text        NOT NULL,
    param_hash     text        NOT NULL,
    -- CHECK constraints named as the held table's (ATTACH matches names)
    state          text        NOT NULL CONSTRAINT idempotency_record_state_check
        CHECK (state IN ('IN_FLIGHT', 'DONE', 'FAILED', 'UNKNOWN')),
    owner          text        NOT NULL,
    fence          bigint      NOT NULL CONSTRAINT idempotency_record_fence_check CHECK (fence > 0),
    lease_until    timestamptz NOT NULL,
    result_status  int,
    result_headers jsonb,
    result_body    bytea,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    result_ref     text,
    bucket         date        NOT NULL DEFAULT '1970-01-01',
    CONSTRAINT idempotency_record_terminal_has_result
        CHECK (state NOT IN ('DONE', 'FAILED') OR result_status IS NOT NULL),
    PRIMARY KEY (idem_key, bucket)
) PARTITION BY RANGE (bucket);

-- The same definitions as the held table's indexes, so ATTACH adopts them
-- instead of building new ones.
CREATE INDEX idempotency_record_sweep_idx
    ON idempotency_record (expires_at)
    WHERE state IN ('DONE', 'FAILED');
CREATE INDEX idempotency_record_state_updated_idx
    ON idempotency_record (state, updated_at);

ALTER TABLE idempotency_record ATTACH PARTITION idempotency_record_held
    FOR VALUES FROM (MINVALUE) TO ('2000-01-01');
-- Daily partitions are created ahead by the store (ensurePartitions) each
-- time it migrates or sweeps.
