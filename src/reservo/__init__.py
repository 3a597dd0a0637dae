"""reservo: the transactional core for scarce things grabbed at once."""

__version__ = "0.3.0"
