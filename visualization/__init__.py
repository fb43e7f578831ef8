"""Training curves."""
