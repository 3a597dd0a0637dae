-- The event contract: every event of one aggregate carries that aggregate's key.
--
-- An appointment's life continues through reschedules (each books a new
-- appointment in place of the old one), so its events are keyed by the first
-- appointment of the chain. NULL: the appointment is its own first.
ALTER TABLE appointment ADD COLUMN IF NOT EXISTS lineage_id bigint;

-- Chains rescheduled before this release: each appointment gets its chain's
-- first appointment (walking rescheduled_from back to the one without it).
WITH RECURSIVE chain (id, first_id) AS (
    SELECT id, id FROM appointment
     WHERE rescheduled_from IS NULL
       AND id IN (SELECT rescheduled_from FROM appointment WHERE rescheduled_from IS NOT NULL)
    UNION ALL
    SELECT a.id, chain.first_id
      FROM appointment a JOIN chain ON a.rescheduled_from = chain.id
)
UPDATE appointment a SET lineage_id = chain.first_id
  FROM chain
 WHERE a.id = chain.id AND a.rescheduled_from IS NOT NULL AND a.lineage_id IS NULL;
