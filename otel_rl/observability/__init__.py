"""The server's Prometheus metrics: HTTP requests, ingest, the store and training (the gateway's own are in
otel_rl.gateway.metrics), in one registry served at `GET /metrics`."""
