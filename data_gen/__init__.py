"""Data-generation pipelines (AutoExplore, DangerousTaxi, ALFWorld); their LLM client is the top-level ``llm.py``."""
