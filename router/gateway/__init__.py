"""The gRPC side: one gateway process in front of the cluster (services, delivery, metrics)."""
