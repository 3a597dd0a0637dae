-- System accounts belong to nobody, and matches start inside the accepted range.

-- 1. WORLD and HOUSE accounts were written with owner_id 0, so any check of the
--    form "the caller's sub equals the owner" matched them for a caller whose sub
--    was 0 (and moved the world's money into that caller's account). An owner is
--    now a user (> 0) for a CUSTOMER account and NULL for a system one: NULL never
--    equals a sub, in SQL or in Python.
ALTER TABLE wallet_account ALTER COLUMN owner_id DROP NOT NULL;
UPDATE wallet_account SET owner_id = NULL WHERE kind <> 'CUSTOMER';
-- Validated at once: a customer account without a real owner is money nobody may
-- hold, and the migration must stop rather than keep one.
ALTER TABLE wallet_account ADD CONSTRAINT wallet_account_owner CHECK (
    (kind = 'CUSTOMER' AND owner_id IS NOT NULL AND owner_id > 0)
    OR (kind <> 'CUSTOMER' AND owner_id IS NULL)
);

-- 2. The database's copy of the API's Instant rule (core.http.schemas.Instant): a
--    start outside [2000-01-01Z, 2100-01-01Z) was once stored without its offset
--    and made every bet on the match fail. NOT VALID: rows written before the API
--    refused such instants stay readable; every new or updated row is checked.
ALTER TABLE betting_match ADD CONSTRAINT betting_match_starts_at_range
    CHECK (starts_at >= '2000-01-01Z' AND starts_at < '2100-01-01Z') NOT VALID;
