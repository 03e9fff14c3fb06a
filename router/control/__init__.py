"""The control plane: the SessionRouter actor, its tables and the placement policy."""
