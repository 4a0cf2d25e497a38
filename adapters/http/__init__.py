"""OpenAI-compatible servers: dialects, the HTTP client, token-id mapping, and starting or attaching to a server."""
