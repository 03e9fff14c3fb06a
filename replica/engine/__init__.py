"""The engine: continuous batching of session turns, its scheduler, model runner and sampling."""
