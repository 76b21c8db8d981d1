"""The HTTP API: the OpenAI routes, passthrough, /decide, /stats and the service endpoints."""
