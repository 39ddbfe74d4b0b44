"""Reading results: per-cell selection, per-subject summaries, pairing."""
