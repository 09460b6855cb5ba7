"""The rollout-pipeline simulator: duration models, the event-driven pipeline, the tables and figures.

    from lrl_lab.sim import agent_episode_durations, simulate_pipeline

``python -m lrl_lab.sim`` prints the tables and writes the figures (docs/simulate.md).
"""

from lrl_lab.sim.durations import agent_episode_durations, exponential_durations, failure_mask, harmonic
from lrl_lab.sim.pipeline import simulate_pipeline
from lrl_lab.sim.tables import DESIGNS, Setup

__all__ = [
    "agent_episode_durations",
    "exponential_durations",
    "failure_mask",
    "harmonic",
    "simulate_pipeline",
    "DESIGNS",
    "Setup",
]
