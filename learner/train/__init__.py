"""Training: data, configuration, the SFT loop, checkpoints and metrics."""
