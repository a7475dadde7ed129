"""The server's Prometheus metrics: HTTP requests, the store and training, with the collector's (in
otel_rl.collector.ingest_metrics) and the gateway's (otel_rl.gateway.metrics), in one registry served at
`GET /metrics`."""
