"""What serves calls: the server factory, the services of one server on their shared state, the
answer log, quotas, limits, auth, metrics, logs and the API's views."""
