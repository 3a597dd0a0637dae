"""bench/compare.py's parts: the headline benchmarks and how their output is read
(benches.py, figures.py), the table of medians and ratios (table.py), and the
trees and virtualenvs the two sides run in (trees.py)."""
