"""Operator tools: the command line, serve, demo and top."""
