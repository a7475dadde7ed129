"""The OTLP receivers: decode requests (HTTP and gRPC), flatten them to Arrow, hand them to the store."""
