"""``session-router demo``: a local cluster serving many short sessions, outside the serving
package (it uses the cluster only as a user would: ``Server``, the client, /metrics)."""
