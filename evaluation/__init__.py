"""Evaluation of trained configurations and of API models."""
