"""Redis, always failing open: the client and its gate, the cache and marks, the
per-process cache, rate limits."""
