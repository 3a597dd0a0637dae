"""Betting: matches, bets with up to 20 selections, results and set-based
settlement. Pays out through the wallet's public facade and events only.

The public facade other modules and the console use; they never import the
module's files."""

from reservo.betting.domain import Match
from reservo.betting.intake import ResultIntake
from reservo.betting.schemas import ResultIn
from reservo.betting.service import BettingService

__all__ = ["BettingService", "Match", "ResultIn", "ResultIntake"]
