"""Text environments behind one gymnasium API: DangerousTaxi, AutoExplore, ALFWorld."""
