"""Profiling: the engine profile measured on the servers, kept in serve, and its CLI."""
