"""Training: the loop, the loss, metrics, distributed processes."""
