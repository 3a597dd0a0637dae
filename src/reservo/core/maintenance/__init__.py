"""What keeps growing tables bounded: the batched pruner and day partitions."""
