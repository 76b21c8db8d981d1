"""The wire: a request's bytes to a backend and back, its life record, the acceptance it reports."""
