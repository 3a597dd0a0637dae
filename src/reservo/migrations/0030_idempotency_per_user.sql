-- Idempotency-Keys are scoped to the user (the token's `sub`) and the endpoint,
-- no longer to the role as well: the same user acting under two roles is one
-- caller, so one key can never take effect twice through a change of role.
-- `caller` held "<role>:<sub>"; it now holds "<sub>" (Principal.key_owner).
--
-- The keys already stored keep answering their retries: each row is renamed to
-- its user. Where one user stored the same key on the same endpoint under two
-- roles, the first one stored stays (the effect a retry must replay) and the
-- later ones go.
DELETE FROM idempotency_key later
 USING idempotency_key earlier
 WHERE later.caller LIKE '%:%'
   AND earlier.caller LIKE '%:%'
   AND split_part(later.caller, ':', 2) = split_part(earlier.caller, ':', 2)
   AND later.endpoint = earlier.endpoint
   AND later.key = earlier.key
   AND (later.created_at, later.caller) > (earlier.created_at, earlier.caller);

UPDATE idempotency_key
   SET caller = split_part(caller, ':', 2)
 WHERE caller LIKE '%:%';
