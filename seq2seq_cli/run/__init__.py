"""The run directory: its lock and guards, checkpoints (save, verify, average, load)."""
