"""The web view at /ui (docs/ui.md): rollouts, a rollout's timeline, the token-mask inspector, training."""
