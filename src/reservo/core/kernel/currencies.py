"""Which currency codes the service accepts: ISO 4217's active codes, from
pycountry (the iso-codes data, updated with each ISO amendment: a new currency
arrives with a dependency update, a withdrawn one leaves), plus the codes an
operator adds (``RESERVO_WALLET_CURRENCIES``, e.g. a token or an in-house unit).
Three capital letters either way: the column's CHECK (migration 0006)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pycountry

CODE = re.compile(r"^[A-Z]{3}$")
ISO_4217: frozenset[str] = frozenset(c.alpha_3 for c in pycountry.currencies)


def parse_extra(text: str) -> frozenset[str]:
    """``"BTC, ZZT"``: comma-separated codes of three capital letters. Raises
    ValueError on any other entry, so a typo stops the start."""
    codes = {entry.strip() for entry in text.split(",") if entry.strip()}
    bad = sorted(code for code in codes if not CODE.fullmatch(code))
    if bad:
        raise ValueError(f"not a currency code (three capital letters): {', '.join(bad)}")
    return frozenset(codes)


@dataclass(frozen=True)
class Currencies:
    """The codes accepted: ISO 4217 and the operator's."""

    extra: frozenset[str] = frozenset()

    def accepts(self, code: str) -> bool:
        return code in ISO_4217 or code in self.extra

    def refusal(self, code: str) -> str | None:
        """Why ``code`` is refused, or None when it is accepted."""
        if self.accepts(code):
            return None
        return (
            f"currency {code[:8]!r} is not an ISO 4217 code"
            " (RESERVO_WALLET_CURRENCIES may add others)"
        )
