"""The OpenAI-compatible HTTP surface: wire models, conversion, the server, errors,
API keys and templates."""
