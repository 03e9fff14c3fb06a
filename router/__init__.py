"""The cluster side: the SessionRouter actor, placement, the gRPC gateway, metrics, client, CLI."""
