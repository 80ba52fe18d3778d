"""What a run leaves on disk: checkpoints, the writer lock, metrics, averaging."""
