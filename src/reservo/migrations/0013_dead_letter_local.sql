-- Dead letters of the in-process transport: a consumer that rejects an event
-- parks it here too (the Kafka runner parks records by partition and offset; a
-- local event has neither, and is parked once per consumer and event).
ALTER TABLE dead_letter ALTER COLUMN partition DROP NOT NULL,
                        ALTER COLUMN record_offset DROP NOT NULL;
CREATE UNIQUE INDEX dead_letter_local_once ON dead_letter (consumer, event_id)
    WHERE partition IS NULL;
