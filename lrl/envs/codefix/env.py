"""CodeFixEnv: test candidate patches in real sandboxes, then submit one; the reward is a real run of the tests.

Actions: ``test K`` applies candidate K in a fresh sandbox and runs the task's tests (observation: ``K passed
3 of 3`` / ``K failed 1 of 3`` / ``K error 0 of 3`` / ``K timeout 0 of 3``); ``submit K`` ends the episode with
reward 1 if candidate K passes a real run of the tests, else 0. Anything else is malformed (``invalid``, reward
0); running out of turns is ``truncated`` (reward 0).

Failure kinds (docs/sandbox.md): a candidate that fails, raises, crashes or hangs past the test timeout is the
agent's outcome, scored by the reward (a hang is a failed test: a discarded timeout is an exit a policy can
learn to take). A sandbox that could not start, a worker that died or stopped answering, a harness out of
memory is the infrastructure's: after ``--env-retries`` fresh tries the episode ends as an environment failure
(no gradient, its task carried to the next batch). Every call's outcome is counted in ``info["metrics"]``.
"""

from __future__ import annotations

from lrl.envs.base import StepResult, small_number
from lrl.envs.codefix.sandbox.harness import AGENT_KINDS, INFRA_KINDS, PASSED
from lrl.envs.codefix.tasks import MODULE, CodeTask

COUNTERS = (
    "sandbox_runs",
    "tests",
    "submits",
    *(f"verdict_{k}" for k in AGENT_KINDS),
    *(f"infra_{k}" for k in INFRA_KINDS),
    "retries",
    "retry_seconds",
    "tool_seconds",
)


class CodeFixEnv:
    """reset(task) -> prompt ids; step(action ids) -> StepResult (each test or submit is one sandboxed run)."""

    def __init__(self, tok, pool_of, max_turns: int = 5):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1; got {max_turns}")
        self.tok = tok
        self.pool_of = pool_of  # () -> the process's EnvPool (started on first use)
        self.max_turns = max_turns
        self.task: CodeTask | None = None
        self.turns = 0
        self.done = False

    def reset(self, task: CodeTask) -> list[int]:
        self.task = task
        self.turns = 0
        self.done = False
        return self.tok.prompt(task.prompt)

    def parse(self, action: list[int]) -> tuple[str, int | None]:
        if not action or action[-1] != self.tok.eos_id:
            return "invalid", None
        words = self.tok.decode(action[:-1], skip_special=False).split()
        if len(words) == 2 and words[0] in ("test", "submit"):
            k = small_number(words[1], self.task.n)
            if k is not None and k >= 1:
                return words[0], k
        return "invalid", None

    def step(self, action: list[int]) -> StepResult:
        if self.task is None or self.done:
            raise RuntimeError("step() called on an episode that is not running; call reset(task) first")
        self.turns += 1
        kind, k = self.parse(list(action))
        if kind == "invalid":
            self.done = True
            return StepResult(
                [], 0.0, True, {"action": kind, "invalid": True, "truncated": False, "metrics": {}}
            )
        task = self.task
        verdict, retries, retry_seconds = self.pool_of().run(
            task.files(k), MODULE, list(task.calls), list(task.expect), name=f"t{task.task_id}c{k}"
        )
        metrics = {
            "sandbox_runs": 1.0 + retries,
            "tests" if kind == "test" else "submits": 1.0,
            "retries": float(retries),
            "retry_seconds": retry_seconds,
            "tool_seconds": verdict.seconds,
            ("infra_" if verdict.infrastructure else "verdict_") + verdict.kind: 1.0,
        }
        info = {"action": kind, "invalid": False, "truncated": False, "metrics": metrics}
        info["tool_time"] = verdict.seconds
        if verdict.infrastructure:
            self.done = True
            info.update(env_failure=True, infra=verdict.kind, tool_error=True, detail=verdict.detail)
            return StepResult([], 0.0, True, info)
        if kind == "submit":
            self.done = True
            return StepResult([], float(verdict.kind == PASSED), True, info)
        if self.turns >= self.max_turns:
            self.done = True
            info["truncated"] = True
            return StepResult([], 0.0, True, info)
        text = f"{k} {verdict.kind} {verdict.passed} of {verdict.total}"
        return StepResult(self.tok.observation(text), 0.0, False, info)
