"""Outcomes: what each finished request leaves behind (metrics, log line, lessons, JSONL logs)."""
