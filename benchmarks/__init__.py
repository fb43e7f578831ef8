"""Performance measurements (run as scripts; not tests)."""
