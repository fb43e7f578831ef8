"""Data-generation pipelines (AutoExplore, DangerousTaxi, ALFWorld); their LLM client is ``utils/llm.py``."""
