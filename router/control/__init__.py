"""The control plane: the SessionRouter actor, its tables, the placement policy, and the
supervision and autoscaling of the replicas."""
