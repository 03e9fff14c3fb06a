"""``session-router demo``: a local cluster serving many short sessions. It uses the cluster only
as a user would (``Server``, the client, /metrics), never the serving parts' insides."""
