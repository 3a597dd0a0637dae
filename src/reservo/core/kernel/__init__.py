"""What everything else in core is built on: the clock, errors, metrics, logging,
tracing, the event contract. Imports nothing of core."""
