"""asyncio building blocks with no I/O of their own: loops, backoff, retries,
the circuit breaker, per-key turns. Imports only core.kernel."""
