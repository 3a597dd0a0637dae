"""A history checker that does not trust the code under test.

The clients record every operation they try (``record.History``): when it was
invoked, and how it ended: ``ok`` (the service acknowledged it), ``fail`` (the
service refused it for good: it must have had no effect) or ``info`` (the client
never learned: a timeout, a 503 it gave up on; 0 or 1 effect). Afterwards the
final state is read by plain SQL, and ``check`` compares the two, model by model:
the bank (money conserved, every acknowledged transfer present exactly once, none
applied twice), appointments as sets per slot (never over capacity, every
acknowledged booking present unless cancelled) and jobs (every accepted job ran,
one job per submission).

Nothing here imports reservo: the checker knows the schema's tables and columns,
not the service's code, so a bug in the service cannot hide itself from it.
"""
