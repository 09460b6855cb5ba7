"""The episodes of the groups a rollout worker has started, until each group is complete."""

from __future__ import annotations

import time


class Groups:
    """Finished episodes per started group (a group: one task, ``episodes_per_group`` episodes)."""

    def __init__(self, episodes_per_group: int):
        self.size = episodes_per_group
        self.done: dict[int, list] = {}  # serial -> finished episodes (Episode), in any order
        self.first: dict[int, float] = {}  # serial -> wall clock of its first episode's start
        self.tasks: dict[int, int] = {}  # serial -> its task's position, so that a group can be given again

    def open(self, serial: int, task: int) -> None:
        self.done.setdefault(serial, [])
        self.first.setdefault(serial, time.time())
        self.tasks[serial] = task

    def finish(self, episode) -> tuple[int, list, float] | None:
        """Record a finished episode (tag (serial, j)) -> (serial, its episodes in order, seconds) once complete."""
        serial, _ = episode.tag
        self.done[serial].append(episode)
        if len(self.done[serial]) < self.size:
            return None
        episodes = sorted(self.done.pop(serial), key=lambda e: e.tag[1])
        self.tasks.pop(serial, None)
        return serial, episodes, time.time() - self.first.pop(serial)

    def finished_count(self, serial: int) -> int:
        return len(self.done.get(serial, ()))

    def cut(self, serial: int) -> tuple[int, list, float]:
        """Close a group with the episodes it has finished -> (serial, those episodes in order, seconds)."""
        episodes = sorted(self.done.pop(serial), key=lambda e: e.tag[1])
        self.tasks.pop(serial, None)
        return serial, episodes, time.time() - self.first.pop(serial)

    def state(self) -> dict:
        return {
            "done": {s: [e.state() for e in eps] for s, eps in self.done.items()},
            "elapsed": {s: time.time() - t for s, t in self.first.items()},
            "tasks": dict(self.tasks),
        }

    def restore(self, state: dict, task_of) -> None:
        from lrl.rollout import Episode

        self.done = {
            int(s): [Episode.from_state(e, task_of(e["task_id"])) for e in eps]
            for s, eps in state["done"].items()
        }
        self.first = {int(s): time.time() - t for s, t in state["elapsed"].items()}
        self.tasks = {int(s): t for s, t in state.get("tasks", {}).items()}  # absent from older checkpoints
