-- Step-up by the requester (DESIGN section 13): how the person who decided
-- authenticated, as their token said (acr, amr, auth_time), recorded with
-- the decision. Empty and NULL when the token did not say. The append-only
-- trigger of approval_event still holds: these are set on insert only.
ALTER TABLE approval_event
    ADD COLUMN acr       text        NOT NULL DEFAULT '',
    ADD COLUMN amr       jsonb       NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN auth_time timestamptz;
