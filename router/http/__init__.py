"""The OpenAI-compatible front door: HTTP beside each gateway's gRPC server (docs/openai.md)."""
