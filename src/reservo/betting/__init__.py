"""Betting: matches, bets with up to 20 selections, results and set-based
settlement. Pays out through the wallet's public facade and events only."""
