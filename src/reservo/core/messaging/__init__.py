"""Events between transactions: the outbox, the inbox, transports, dead letters,
the failure rule, poison rows, per-key ordering, and the ``Notification`` a
module's renderer makes of an event."""
