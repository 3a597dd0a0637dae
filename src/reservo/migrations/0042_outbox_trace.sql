-- The trace context (W3C traceparent) and request id an event was emitted in
-- (reservo.core.kernel.tracing): the relay hands them to the transport, so the
-- consumers' work on the event continues the request's trace and logs under its
-- request id. NULL for an event emitted outside any request or trace, and for
-- every row written before this migration. Nullable without a default: adding
-- them rewrites no partition of the outbox.
ALTER TABLE outbox ADD COLUMN traceparent text, ADD COLUMN request_id text;
