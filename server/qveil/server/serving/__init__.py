"""What serves calls: the services of one server on their shared state, the answer log,
quotas, limits, auth, metrics, health, logs and the API's views (``qveil.server.app`` puts them
together with the transports)."""
