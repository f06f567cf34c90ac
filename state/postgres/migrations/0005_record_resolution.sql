-- Who settled an UNKNOWN or IN_FLIGHT record by hand (`idemgate ops resolve
-- --as NAME --reason TEXT`), and why: one row per resolution, never changed.
CREATE TABLE record_resolution (
    resolution_id bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idem_key      char(32)    NOT NULL,
    actor         text        NOT NULL,
    reason        text        NOT NULL,
    state         text        NOT NULL CHECK (state IN ('DONE', 'FAILED')),
    result_status int         NOT NULL,
    at            timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX record_resolution_key_idx ON record_resolution (idem_key, resolution_id);

CREATE FUNCTION record_resolution_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'record_resolution is append-only';
END
$$;

CREATE TRIGGER record_resolution_append_only
    BEFORE UPDATE OR DELETE ON record_resolution
    FOR EACH ROW EXECUTE FUNCTION record_resolution_append_only();
