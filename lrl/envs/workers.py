"""Environment workers: where an environment's steps (its tool calls) run, off the decode loop.

The episode loop (:class:`lrl.rollout.Rollout`) hands every finished action to a :class:`ToolRunner` and
takes the answers back when they are ready, so the engine keeps decoding the other episodes while some wait
for their tools. Two runners:

- :class:`InlineTools`: the step runs at once, in the caller's thread (instant tools; the default);
- :class:`ThreadTools`: every step runs on a thread of its own, so slow tools overlap with decoding and with
  each other. A thread, not a process: a tool call spends its time waiting (a test suite, a container, a
  sleep), which releases the GIL, and an environment object never has to be pickled. A step that does not
  return within ``timeout`` seconds is abandoned and answered as an environment failure; the thread is left
  to finish on its own (a daemon), so a hung tool costs one thread, never the run.

``--tool-latency`` (:mod:`lrl.envs.latency`) makes each step last a drawn delay. The delay is drawn when the
step is submitted, from the run's seeded generator, in the order the loop submits steps. On the real clock the
step's thread sleeps the rest of the delay; on a :class:`LogicalClock` (``--deterministic``) nothing sleeps:
the answer is due at ``submit time + delay`` of logical time, so the order of completions, and with it the
whole run, repeats exactly.

Either way an exception raised by ``env.step`` (even ``SystemExit``) is an environment failure (no gradient, the
task carried to the next batch), never a reward of 0 and never the end of the run. An environment needs to know
nothing of threads: each env object is stepped by one thread at a time, its own episode's.

Every wait is bounded. A step on a thread that has no ``--tool-timeout`` is bounded at
:data:`DEFAULT_TOOL_TIMEOUT` (the run says so at its start), and ``ready(block=True)`` returns after at most
:data:`WAIT_SLICE` seconds even when nothing has answered, so that the loop above it (a rollout worker) keeps
sending heartbeats while all its episodes wait for tools: a worker that waits is alive, and says so.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from lrl.envs.base import StepResult
from lrl.envs.latency import Latency
from lrl.sections import EnvironmentOptions

LOGICAL_TOKEN_SECONDS = 0.025  # logical time of one decode step: a sequence advancing 40 tokens per second
REAL_TOOL_ENVS: set[str] = set()  # environments whose steps are real programs: always on threads (codefix)
DEFAULT_TOOL_TIMEOUT = 1800.0  # seconds: the bound of a step on a thread when --tool-timeout is not given
WAIT_SLICE = 0.1  # seconds: the longest a blocking wait for answers lasts before it returns to its caller


def failure(reason: str, detail: str = "") -> StepResult:
    """The answer to a step that failed in the worker (it timed out or raised): no score, the episode ends."""
    info = {"invalid": False, "truncated": False, "env_failure": True, reason: True}
    if detail:
        info["detail"] = detail
    return StepResult([], 0.0, True, info)


def run_step(env, action: list[int]) -> StepResult:
    """env.step(action), with an exception (even SystemExit) answered as an environment failure that names it."""
    try:
        return env.step(action)
    except (Exception, SystemExit) as err:  # noqa: BLE001 (any error of user code is an environment failure)
        return failure("tool_error", f"{type(err).__name__}: {err}")


class RealClock:
    """Wall-clock seconds (monotonic)."""

    logical = False

    def now(self) -> float:
        return time.monotonic()

    def tick(self) -> None:
        """A decode step happened (real time passes by itself)."""


class LogicalClock:
    """Logical seconds: each decode step is LOGICAL_TOKEN_SECONDS; with nothing to decode, time jumps."""

    logical = True

    def __init__(self, start: float = 0.0):
        self.t = start

    def now(self) -> float:
        return self.t

    def tick(self) -> None:
        self.t += LOGICAL_TOKEN_SECONDS

    def jump(self, t: float) -> None:
        self.t = max(self.t, t)


class InlineTools:
    """Every step in the caller's thread, when its answer is asked for, in the order submitted."""

    stalled = False  # an answer is always there when asked for

    def __init__(self):
        self.calls: list[tuple[int, object, list[int]]] = []

    @property
    def pending(self) -> int:
        return len(self.calls)

    def submit(self, key: int, env, action: list[int], delay: float | None = None, times_out: bool = False):
        self.calls.append((key, env, list(action)))

    def ready(self, block: bool = False) -> list[tuple[int, StepResult, float]]:
        """Run the submitted steps now -> (key, result, seconds it took), in submission order."""
        calls, self.calls = self.calls, []
        out = []
        for key, env, action in calls:
            start = time.perf_counter()
            result = run_step(env, action)
            out.append((key, result, time.perf_counter() - start))
        return out

    def forget(self, key: int) -> None:
        """Drop a submitted step that has not run (its episode was stopped)."""
        self.calls = [c for c in self.calls if c[0] != key]

    def state(self) -> list:
        return [{"key": key, "remaining": 0.0, "times_out": False} for key, _, _ in self.calls]

    def close(self) -> None:
        self.calls = []


@dataclass
class _Call:
    key: int
    submitted: float  # on the runner's clock
    due: float  # when the answer is due: submitted + delay (the deadline if that is later than the timeout)
    order: int
    times_out: bool  # on a logical clock: the drawn delay reaches the timeout
    started: float = field(default_factory=time.monotonic)  # real time, whatever the runner's clock
    result: StepResult | None = None
    finished: threading.Event = field(default_factory=threading.Event)


class ThreadTools:
    """Each step on a thread of its own, with a drawn latency and a timeout (see the module)."""

    def __init__(
        self,
        latency: Latency,
        generator: torch.Generator,
        timeout: float | None = None,
        clock: RealClock | LogicalClock | None = None,
        poll: float = 0.005,
    ):
        self.latency = latency
        self.generator = generator
        self.timeout = DEFAULT_TOOL_TIMEOUT if timeout is None else timeout
        self.clock = clock or RealClock()
        self.poll = poll
        self.calls: dict[int, _Call] = {}
        self.answers: queue.SimpleQueue = queue.SimpleQueue()
        self.submitted = 0
        self.timeouts = 0
        self.stalled = False  # logical clock: a due answer's thread is still running (decode must wait)

    @property
    def pending(self) -> int:
        return len(self.calls)

    def submit(
        self, key: int, env, action: list[int], delay: float | None = None, times_out: bool = False
    ) -> None:
        """Start the step on its own thread; `delay` (drawn here when not given) is how long it lasts, and
        `times_out` marks a resubmitted step that was already bound to time out (:meth:`state`)."""
        delay = self.latency.draw(self.generator) if delay is None else delay
        now = self.clock.now()
        times_out = times_out or delay >= self.timeout
        due = now + min(delay, self.timeout)
        call = _Call(key, now, due, self.submitted, times_out)
        self.submitted += 1
        self.calls[key] = call
        sleep = 0.0 if self.clock.logical else delay
        thread = threading.Thread(
            target=self._work, args=(call, env, list(action), sleep), daemon=True, name=f"lrl-tool-{key}"
        )
        thread.start()

    def _work(self, call: _Call, env, action: list[int], sleep: float) -> None:
        start = time.monotonic()
        result = None
        try:
            result = run_step(env, action)
            # the delay runs out while the timeout is watched by ready(); sleeping past it would only hold a thread
            rest = min(sleep, self.timeout + WAIT_SLICE) - (time.monotonic() - start)
            if rest > 0:
                time.sleep(rest)
        except BaseException as err:  # noqa: BLE001 (the answer must come, whatever ended the thread)
            if result is None:
                result = failure("tool_error", f"{type(err).__name__}: {err}")
        finally:
            call.result = result if result is not None else failure("tool_error", "the tool's thread ended")
            call.finished.set()
            self.answers.put(call.key)

    def forget(self, key: int) -> None:
        """Stop waiting for a step (its episode was stopped): it is never answered; a thread still running it
        finishes on its own, as a timed-out one does."""
        self.calls.pop(key, None)

    def next_due(self) -> float:
        """The logical time of the next answer due (inf with none pending)."""
        return min((c.due for c in self.calls.values()), default=math.inf)

    def ready(self, block: bool = False) -> list[tuple[int, StepResult, float]]:
        """The answers available now -> (key, result, seconds taken). With `block`, wait for at least one, but
        never longer than WAIT_SLICE: an empty list then means "still waiting", and the caller may beat."""
        if self.clock.logical:
            return self._ready_logical(block)
        return self._ready_real(block)

    def _ready_real(self, block: bool) -> list[tuple[int, StepResult, float]]:
        out = []
        give_up = time.monotonic() + WAIT_SLICE
        while self.calls:
            now = self.clock.now()
            for call in sorted(self.calls.values(), key=lambda c: c.order):
                if call.finished.is_set():
                    out.append(self._answer(call, call.result, now))
                elif now - call.submitted >= self.timeout:
                    self.timeouts += 1
                    out.append(self._answer(call, failure("timeout"), now))
            left = give_up - time.monotonic()
            if out or not block or left <= 0:
                return out
            soonest = min(c.submitted + self.timeout for c in self.calls.values())
            wait = max(min(self.poll * 20, soonest - now, left), 1e-4)
            try:
                self.answers.get(timeout=wait)
            except queue.Empty:
                pass
        return out

    def _ready_logical(self, block: bool) -> list[tuple[int, StepResult, float]]:
        """Answers in order of due time; the clock jumps to the next one when `block` and none is due yet.

        A call that is due must be answered before logical time moves on, whatever real time its thread takes:
        its thread is waited for a slice at a time, and meanwhile :attr:`stalled` is set, so the episode loop
        decodes nothing (the clock does not tick) until it is answered; no later answer passes it. A thread that
        runs `timeout` real seconds (a real hang) ends as a timeout."""
        self.stalled = False
        if not self.calls:
            return []
        if block:
            self.clock.jump(self.next_due())
        out = []
        for call in sorted(self.calls.values(), key=lambda c: (c.due, c.order)):
            if call.due > self.clock.now():
                break
            left = call.started + self.timeout - time.monotonic()
            finished = call.finished.wait(max(min(left, WAIT_SLICE), 0.0))
            hung = not finished and time.monotonic() - call.started >= self.timeout
            if not (finished or hung):
                self.stalled = True  # due and still running: answered at a later look, in its place
                break
            timed_out = hung or call.times_out
            if timed_out:
                self.timeouts += 1
            out.append(self._answer(call, failure("timeout") if timed_out else call.result, call.due))
        return out

    def _answer(self, call: _Call, result: StepResult, now: float) -> tuple[int, StepResult, float]:
        del self.calls[call.key]
        return call.key, result, now - call.submitted

    def state(self) -> list[dict]:
        """The steps in flight, in submission order, with the time each still has to run: resubmitted with that
        delay (:meth:`submit`), they are answered when they would have been (exactly, on a logical clock)."""
        now = self.clock.now()
        calls = sorted(self.calls.values(), key=lambda c: c.order)
        return [{"key": c.key, "remaining": max(c.due - now, 0.0), "times_out": c.times_out} for c in calls]

    def close(self) -> None:
        self.calls = {}


def make_tools(environment: EnvironmentOptions, generator: torch.Generator, clock=None):
    """The runner the environment section asks for: threads when steps take time or may hang, else inline (a step
    on a thread without --tool-timeout is bounded at DEFAULT_TOOL_TIMEOUT)."""
    from lrl.envs.latency import parse_latency

    latency = parse_latency(environment.tool_latency)
    if latency.off and environment.tool_timeout is None and environment.env not in REAL_TOOL_ENVS:
        return InlineTools()
    return ThreadTools(latency, generator, environment.tool_timeout, clock)
