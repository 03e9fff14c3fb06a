"""Pools of one replica: req rows, KV token pages, mamba state slots and their accounting."""
