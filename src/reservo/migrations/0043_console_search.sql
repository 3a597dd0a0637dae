-- The console finds things by name (reservo.console.search): doctors by name,
-- cars by model or city, matches by team or external id, people by e-mail. An
-- operator types part of a name, so each search is ILIKE '%text%': trigram GIN
-- indexes (pg_trgm) answer it without reading the table, whatever the position
-- of the text in the name. pg_trgm is a trusted extension (PostgreSQL 13+): the
-- database's owner may create it without being a superuser.
--
-- Plain CREATE INDEX, as in 0014: on a deployment whose tables are already large,
-- create the same indexes first with CREATE INDEX CONCURRENTLY (same names and
-- definitions, outside a transaction); IF NOT EXISTS then skips them here. None
-- of these tables is on a hot write path (doctors, cars, matches and contacts
-- are written rarely; wallet accounts once per owner and currency).
CREATE EXTENSION IF NOT EXISTS pg_trgm;

-- Doctors by part of the name; the list is in name order (keyset on (name, id)),
-- which the btree also serves for a text of one or two characters (too short
-- for a trigram): the walk in name order stops after a page.
CREATE INDEX IF NOT EXISTS doctor_name_trgm ON doctor USING gin (name gin_trgm_ops);
CREATE INDEX IF NOT EXISTS doctor_name_id ON doctor (name, id);

-- Cars by part of the model or of the city, listed in model order.
CREATE INDEX IF NOT EXISTS car_model_trgm ON car USING gin (model gin_trgm_ops);
CREATE INDEX IF NOT EXISTS car_city_trgm ON car USING gin (city gin_trgm_ops);
CREATE INDEX IF NOT EXISTS car_model_id ON car (model, id);

-- Matches by part of a team's name or of the external id (one bitmap OR of
-- the three), newest kick-off first.
CREATE INDEX IF NOT EXISTS betting_match_home_trgm ON betting_match USING gin (home gin_trgm_ops);
CREATE INDEX IF NOT EXISTS betting_match_away_trgm ON betting_match USING gin (away gin_trgm_ops);
CREATE INDEX IF NOT EXISTS betting_match_external_id_trgm
    ON betting_match USING gin (external_id gin_trgm_ops);

-- People (patients, customers: user ids are global) by part of their e-mail.
CREATE INDEX IF NOT EXISTS contact_email_trgm ON contact USING gin (email gin_trgm_ops);

-- A person's wallet accounts: wallet_account had no index on its owner (the
-- wallet reads accounts by id only).
CREATE INDEX IF NOT EXISTS wallet_account_owner ON wallet_account (owner_id, id)
    WHERE kind = 'CUSTOMER';
