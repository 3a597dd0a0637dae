"""Operations: what an operator does through the API (dead letters today)."""
