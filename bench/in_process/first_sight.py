"""What a request pays the first time a process sees its token or its slot list,
for the tree on PYTHONPATH (run it once per tree to compare them):

- a bearer token's first verification (``TokenVerifier.verify`` of tokens it
  has not seen), with the verified-token cache empty and with it full (every
  new token then replaces the oldest);
- a store into a full per-process copy (``LocalCache``; the slot lists keep
  4,096), each replacing the oldest entry.

Tokens are minted beforehand (the client's work). Medians of ``--runs``.

    PYTHONPATH=<tree>/src python bench/in_process/first_sight.py --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib
from reservo.core.http.auth import TokenVerifier, mint_token
from reservo.core.redis.local_cache import LocalCache

SECRET = "first-sight-secret-0123456789-0123456789"


def per_call_us(calls: int, started: float) -> float:
    return (time.perf_counter() - started) / calls * 1e6


def unseen_tokens(tokens: list[str], capacity: int, batch: int) -> float:
    """Microseconds per verification of a token not seen before, once
    ``capacity`` tokens were verified (0: no cache at all)."""
    now = datetime.now(UTC)
    verifier = TokenVerifier(SECRET, max_entries=capacity)
    for token in tokens[:capacity]:
        verifier.verify(token, now)
    fresh = tokens[capacity : capacity + batch]
    started = time.perf_counter()
    for token in fresh:
        verifier.verify(token, now)
    return per_call_us(len(fresh), started)


def full_copy_stores(capacity: int, stores: int) -> float:
    """Microseconds per store of a new key into a full LocalCache."""
    cache: LocalCache[int] = LocalCache(60.0, max_entries=capacity)
    for i in range(capacity):
        cache._store(f"list:{i}", i, 60.0)
    started = time.perf_counter()
    for i in range(capacity, capacity + stores):
        cache._store(f"list:{i}", i, 60.0)
    return per_call_us(stores, started)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--batch", type=int, default=20_000, help="new tokens per run")
    p.add_argument("--token-cache", type=int, default=50_000, help="RESERVO_TOKEN_CACHE_SIZE")
    p.add_argument("--copy-entries", type=int, default=4096)
    opts = p.parse_args()
    print(benchlib.machine())
    print(f"reservo code under test: {benchlib.reservo_source()}")
    now = datetime.now(UTC)
    total = opts.token_cache + opts.batch
    print(f"minting {total:,} tokens...", flush=True)
    tokens = [
        mint_token(SECRET, "patient", 10**6 + i, timedelta(hours=1), now) for i in range(total)
    ]
    figures: dict[str, list[float]] = {"empty": [], "full": [], "copy": []}
    for run in range(opts.runs):
        figures["empty"].append(unseen_tokens(tokens, 0, opts.batch))
        figures["full"].append(unseen_tokens(tokens, opts.token_cache, opts.batch))
        figures["copy"].append(full_copy_stores(opts.copy_entries, 200_000))
        print(
            f"[run {run + 1}/{opts.runs}] "
            + ", ".join(f"{k} {v[-1]:.2f} us" for k, v in figures.items()),
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"\nmedians of {opts.runs} runs:")
    print(f"  a new token, no cache                          {med['empty']:6.2f} us")
    print(f"  a new token, cache full ({opts.token_cache:,})            {med['full']:6.2f} us")
    print(f"  a store into a full process copy ({opts.copy_entries:,})      {med['copy']:6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
