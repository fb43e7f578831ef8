"""Data-generation pipelines (AutoExplore, DangerousTaxi, ALFWorld) and the LLM client."""
