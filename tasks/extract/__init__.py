"""Stage `extract`: WARC records -> main text (time-limited sandbox) -> language ID."""
