"""The rollout-pipeline simulator: duration models, the event-driven pipeline, the tables and figures.

    from lrl.sim import agent_episode_durations, simulate_pipeline

``python -m lrl.sim`` prints the tables and writes the figures (docs/simulate.md).
"""

from lrl.sim.durations import agent_episode_durations, exponential_durations, failure_mask, harmonic
from lrl.sim.pipeline import simulate_pipeline
from lrl.sim.tables import DESIGNS, Setup

__all__ = [
    "agent_episode_durations",
    "exponential_durations",
    "failure_mask",
    "harmonic",
    "simulate_pipeline",
    "DESIGNS",
    "Setup",
]
