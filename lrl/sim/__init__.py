"""The rollout-pipeline simulator: duration models, the event-driven simulator, the spec's tables, figures."""
