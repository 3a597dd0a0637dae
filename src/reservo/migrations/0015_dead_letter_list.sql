-- The dead-letter list of one consumer, newest first (GET /api/ops/dead-letters).
CREATE INDEX dead_letter_consumer_id ON dead_letter (consumer, id);
