"""The backends: the server pool, health and load, /metrics scrapes, the state a decision reads."""
