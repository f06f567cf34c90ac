-- The reference a replay names a result by (the operation's result_ref read
-- from the body when the result was recorded), so replays need not parse
-- the stored body. NULL: not recorded; the reader derives it.
ALTER TABLE idempotency_record ADD COLUMN result_ref text;
