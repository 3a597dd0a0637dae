"""Serving requests: FastAPI glue, the hot routes, auth, schemas, pagination,
OpenAPI, Idempotency-Key, batching, health, graceful stop; and the bounded
outbound calls. The top compartment below ``core.module``."""
