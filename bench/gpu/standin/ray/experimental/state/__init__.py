"""ray.experimental.state."""
