"""The OpenAI-compatible HTTP server: its protocol models and its FastAPI app."""
