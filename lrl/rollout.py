"""The episode loop: multi-turn rollouts of any environment with any decoder (held-out evaluation: lrl.evaluation).

One loop serves every sampler and both pipelines: the decode path is a :class:`lrl.decoding.Decoder`
(trainer-style full forwards, or an engine-style KV cache), the distribution a :class:`lrl.decoding.Sampling`,
the environment an :class:`lrl.envs.EnvSpec`, and the environment's steps run on a tool runner
(:mod:`lrl.envs.workers`: at once, or on threads with a latency and a timeout).

:class:`Rollout` holds the episodes in flight (its *slots*) and advances them one engine step at a time. An
episode generates an action token by token (up to the env spec's ``max_action_tokens``, ending at eos), hands
the action to its environment, and generates the next action once the answer is back. Every engine step
decodes all the episodes that are generating in one batched forward. Two ways to schedule it:

- **lockstep** (the synchronous stream's default, and ``--slots 0``): every episode generates its action of the
  turn, then every environment answers, then the next turn begins for all: the batch advances as one;
- **continuous** (``--slots N``): each episode moves on as soon as its own tool answers, so fast episodes do not
  wait for slow ones and the engine decodes while tools run. New episodes may join at any step.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lrl.decoding import Decoder, Sampling, TurnEngine, inverse_cdf_tokens, sample_tokens
from lrl.envs.workers import InlineTools, RealClock
from lrl.episode import Episode, replay

GENERATING = "generating"  # decoding its current action
READY = "ready"  # about to start an action (new, or its tool answered)
BARRIER = "barrier"  # lockstep: its action is complete; tools run once every action of the turn is
TOOL = "tool"  # its environment is answering its last action
OCCUPANCY = {
    GENERATING: "decoding",
    READY: "ready",
    BARRIER: "tool",
    TOOL: "tool",
}  # phase -> occupancy state
SAMPLE = 0.02  # seconds between occupancy samples (Rollout.timeline)


class ContextError(ValueError):
    """An episode grew longer than the model's context."""


@dataclass
class _Slot:
    """One episode in flight, with its environment and where it is in its turn."""

    episode: Episode
    env: Any
    phase: str = READY
    action: list[int] = field(default_factory=list)  # the action being generated
    fed: int = 0  # tokens of the episode the decoder has seen (0 after a weight switch)
    started: float = 0.0  # wall clock (monotonic) at its start


class Rollout:
    """Episodes in flight on one decoder, advanced an engine step at a time (see the module docstring).

    ``add`` starts episodes; ``advance`` runs one engine step and returns the episodes that finished in it;
    ``switch`` loads new weights at this token boundary; ``state`` / ``restore`` hand everything in flight over
    as plain data (environments are rebuilt by replaying their actions). Episodes are kept by a key (their order
    of arrival), which is also the decoder's key for their cached state.
    """

    def __init__(
        self,
        decoder: Decoder,
        spec,
        tasks: Sequence[Any] = (),
        generator: torch.Generator | None = None,
        sampling: Sampling | None = None,
        version: int = 0,
        *,
        lockstep: bool = True,
        tools=None,
        clock=None,
        draws=None,
    ):
        self.decoder = decoder
        self.draws = draws  # lrl.streams.KeyedDraws: each token's uniform keyed by its episode and place (or None)
        self.spec = spec
        self.generator = generator if generator is not None else torch.Generator()
        self.sampling = sampling or Sampling()
        self.version = version
        self.lockstep = lockstep
        self.tools = tools if tools is not None else InlineTools()
        self.clock = clock if clock is not None else RealClock()
        self.stop = spec.tok.eos_id
        self.budget = spec.max_action_tokens
        self.slots: dict[int, _Slot] = {}
        self.next_key = 0
        self.decode_steps = 0  # batched decode forwards so far
        self.slot_seconds = 0.0  # wall seconds summed over the episodes in flight
        self.decode_seconds = 0.0  # wall seconds spent in decode forwards
        # slot-seconds per occupancy state, and samples [wall s, decoding, ready, tool, in flight, paused 0/1]
        self.phase_seconds = {"decoding": 0.0, "ready": 0.0, "tool": 0.0, "paused": 0.0}
        self.timeline: list[list[float]] = []
        self.trace = False  # keep occupancy samples (a pipeline worker takes them at each beat)
        self.step_log: list | None = None  # a list: [episodes decoding, seconds] of each step that decoded
        self._pausing = False
        self._counts = {"decoding": 0, "ready": 0, "tool": 0}
        self._flight = 0
        self._sampled = -1.0
        self._last = time.monotonic()
        self.add(tasks)

    # -- what is in flight ----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return not self.slots

    @property
    def in_flight(self) -> int:
        return len(self.slots)

    def room(self, slots: int) -> int:
        """How many more episodes may start now (the one admission rule of every caller): with ``slots``
        (continuous batching) up to that many in flight; in lockstep (``slots`` 0) any number, once every
        episode in flight is done, so a turn always advances the whole batch together."""
        if slots:
            return max(slots - self.in_flight, 0)
        return sys.maxsize if self.done else 0

    def count(self, phase: str) -> int:
        return sum(s.phase == phase for s in self.slots.values())

    @property
    def between_turns(self) -> bool:
        """No action is half-generated (the cheap moment to hand the state over)."""
        return not any(s.phase == GENERATING for s in self.slots.values())

    def add(self, tasks: Sequence[Any], tags: Sequence[Any] | None = None) -> list[int]:
        """Start one episode per task (a fresh env each) -> their keys; they generate from the next step on."""
        keys = []
        now = time.monotonic()
        for i, task in enumerate(tasks):
            env = self.spec.make()
            episode = Episode(task, env.reset(task))
            episode.tag = tags[i] if tags is not None else None
            self.slots[self.next_key] = _Slot(episode, env, started=now)
            keys.append(self.next_key)
            self.next_key += 1
        self._account()  # the time so far to the slots as they were; the new ones count from now
        return keys

    # -- one engine step ------------------------------------------------------------------------------
    @torch.no_grad()
    def advance(self) -> list[Episode]:
        """One engine step -> the episodes that ended in it (in the order they ended).

        Answers from the environments come in first; in lockstep, a complete turn's actions go to the tools
        together and the next turn starts once every answer is back. Then one batched decode for every generating
        episode. A step that only waited may return nothing and decode nothing.
        """
        self._account()
        began = time.monotonic()
        finished: list[Episode] = []
        waiting = self.count(TOOL)
        if self.lockstep and not waiting and self.count(BARRIER) and not self.count(GENERATING):
            for key in sorted(k for k, s in self.slots.items() if s.phase == BARRIER):
                self._submit(key)
            waiting = self.count(TOOL)
        if waiting:
            # with nothing to decode, wait for an answer (never longer than a slice: the caller beats between
            # steps, so a worker whose episodes all wait on tools stays alive); in lockstep, the turn goes on
            # once every answer is back, over as many steps as that takes
            idle = not any(s.phase in (GENERATING, READY) for s in self.slots.values())
            finished += self._answers(block=idle or self.lockstep)
            if self.tools.stalled:  # a logical clock's due answer is still being computed: time must not move
                self._account()
                return finished
        self._start_actions()
        generating = sorted(k for k, s in self.slots.items() if s.phase == GENERATING)
        if generating:
            self._decode(generating)
            if self.step_log is not None:  # the whole step: answers taken, actions started, the forward
                self.step_log.append([len(generating), time.monotonic() - began])
        self._account()
        return finished

    def _start_actions(self) -> None:
        """Episodes that are ready begin their next action (in lockstep: once the whole turn is back)."""
        ready = [k for k, s in self.slots.items() if s.phase == READY]
        if not ready or (self.lockstep and len(ready) != len(self.slots)):
            return
        context = getattr(self.decoder, "context", None)
        for key in sorted(ready):
            slot = self.slots[key]
            needed = len(slot.episode.ids) + self.budget
            if context is not None and needed > context:
                raise ContextError(
                    f"an episode needs {needed} positions but the model's context is {context} "
                    "(max_position_embeddings); lower max_turns or use a model with a longer context"
                )
            slot.phase = GENERATING
            slot.action = []

    def _decode(self, keys: list[int]) -> None:
        if isinstance(self.decoder, TurnEngine):
            self._engine_step(keys)
            return
        start = time.monotonic()
        rows = []
        for key in keys:
            slot = self.slots[key]
            rows.append((key, slot.episode.ids[slot.fed :]))
            slot.fed = len(slot.episode.ids)
        logits = self.decoder.decode(rows)  # [b, V], one batched forward
        logp = self.sampling.log_probs(logits)
        if self.draws is not None:  # the uniform of each token keyed by (episode, turn, position)
            places = [
                (self.slots[k].episode.tag, len(self.slots[k].episode.actions), len(self.slots[k].action))
                for k in keys
            ]
            uniform = torch.tensor(self.draws.uniforms(places), dtype=torch.float64, device=logp.device)
            token = inverse_cdf_tokens(logp, uniform).squeeze(1)
            chosen = logp.gather(1, token[:, None]).squeeze(1)
            token, chosen = token.cpu(), chosen.cpu()
        else:
            token, chosen = sample_tokens(logp, self.generator)
        for key, t, lp in zip(keys, token.tolist(), chosen.tolist()):
            self._take(key, [t], [lp], t == self.stop)
        self._stepped(keys, start)

    def _engine_step(self, keys: list[int]) -> None:
        """One step of an engine that samples actions itself: start the actions of episodes that have none in
        flight (new turns, or after a weight switch, with the tokens so far), advance all, take what it made."""
        start = time.monotonic()
        engine = self.decoder
        for key in keys:
            if key not in engine.running:
                slot = self.slots[key]
                if self.draws is not None:
                    seed = self.draws.engine_seed(slot.episode.tag, len(slot.episode.actions))
                else:
                    seed = int(torch.randint(2**31 - 1, (), generator=self.generator))
                engine.submit(key, slot.episode.ids, self.budget - len(slot.action), seed)
        produced = engine.step()
        for key, made in produced.items():
            self._take(key, made.tokens, made.logps, made.finished)
        self._stepped(keys, start)

    def _take(self, key: int, tokens: list[int], logps: list[float], finished: bool) -> None:
        """Append a decode step's tokens to a slot's action; a finished (or full) action goes to its tool."""
        slot = self.slots[key]
        slot.episode.extend(tokens, True, logps, self.version)
        slot.action.extend(tokens)
        if finished or len(slot.action) >= self.budget:  # the action is complete
            slot.episode.actions.append(slot.action)
            slot.phase = BARRIER
            if not self.lockstep:
                self._submit(key)

    def _stepped(self, keys: list[int], start: float) -> None:
        """Count a decode step and charge its wall time to every episode that was generating in it."""
        self.decode_steps += 1
        self.clock.tick()
        spent = time.monotonic() - start
        self.decode_seconds += spent
        for key in keys:
            self.slots[key].episode.generating_seconds += spent

    def _submit(self, key: int) -> None:
        slot = self.slots[key]
        slot.phase = TOOL
        self.tools.submit(key, slot.env, slot.action)

    def _answers(self, block: bool) -> list[Episode]:
        finished = []
        for key, result, seconds in self.tools.ready(block):
            slot = self.slots[key]
            episode = slot.episode
            episode.record(result)
            episode.tool_seconds += seconds
            episode.call_seconds.append(seconds)
            if episode.done:
                episode.seconds = time.monotonic() - slot.started
                finished.append(episode)
                del self.slots[key]
                self.decoder.release([key])
            else:
                slot.phase = READY
        return finished

    def _account(self, sample: bool = False) -> None:
        """Charge the time since the last call to the slots as they were then; sample the occupancy now and
        then (every SAMPLE seconds, or when asked)."""
        now = time.monotonic()
        dt = now - self._last
        self.slot_seconds += self._flight * dt  # as the slots were since the last call
        if self._pausing:
            self.phase_seconds["paused"] += len(self.slots) * dt
        else:
            for name, n in self._counts.items():
                self.phase_seconds[name] += n * dt
        self._last = now
        counts = {"decoding": 0, "ready": 0, "tool": 0}
        for slot in self.slots.values():
            counts[OCCUPANCY[slot.phase]] += 1
        self._counts = counts
        self._flight = len(self.slots)
        if self.trace and (sample or now - self._sampled >= SAMPLE):
            self._sampled = now
            wall = round(time.time(), 4)
            c = counts
            self.timeline.append(
                [wall, c["decoding"], c["ready"], c["tool"], len(self.slots), int(self._pausing)]
            )

    def pausing(self, on: bool) -> None:
        """The worker starts (True) or ends (False) loading weights: its slots count as paused meanwhile."""
        self._account(sample=True)
        self._pausing = on
        self._account(sample=True)

    def take_timeline(self) -> list[list[float]]:
        """The occupancy samples since the last call."""
        out, self.timeline = self.timeline, []
        return out

    def abort(self, keep: Callable[[Episode], bool]) -> list[Episode]:
        """Stop every episode in flight that `keep` rejects, at this token boundary -> those episodes (as far as
        they got). Their tool calls in flight are forgotten (a thread still running finishes on its own and is
        not answered), their decoder state is released, and they never end: the caller starts their tasks again."""
        self._account()
        stopped = [k for k, s in self.slots.items() if not keep(s.episode)]
        out = []
        for key in stopped:
            slot = self.slots.pop(key)
            self.tools.forget(key)
            if isinstance(self.decoder, TurnEngine) and key in self.decoder.running:
                self.decoder.abort([key])
            self.decoder.release([key])
            slot.episode.seconds = time.monotonic() - slot.started
            out.append(slot.episode)
        self._account()
        return out

    # -- weights and hand-over ------------------------------------------------------------------------
    def switch(self, version: int) -> None:
        """The decoder's weights changed (to `version`) at this token boundary: later tokens are tagged with it,
        and the next one is drawn from logits the new weights compute (caches are dropped, sequences re-fed)."""
        self.version = version
        if isinstance(self.decoder, TurnEngine):  # actions in flight restart from their tokens so far
            self.decoder.abort(list(self.decoder.running))
        else:
            self.decoder.reset()
        for slot in self.slots.values():
            slot.fed = 0

    def state(self) -> dict:
        """Everything in flight as plain data: episodes, their phase and action so far, the tools' remaining
        time, the generator and the clock. Environments are not saved; :meth:`restore` replays their actions."""
        calls = {c["key"]: c for c in self.tools.state()}
        slots = []
        for key in sorted(self.slots):
            slot = self.slots[key]
            slots.append(
                {
                    "key": key,
                    "episode": slot.episode.state(),
                    "phase": slot.phase,
                    "action": list(slot.action),
                    "tool": calls.get(key),
                    "env": slot.env.state() if hasattr(slot.env, "state") else None,
                }
            )
        return {
            "slots": slots,
            "version": self.version,
            "next_key": self.next_key,
            "decode_steps": self.decode_steps,
            "clock": self.clock.now() if self.clock.logical else None,
            "generator": self.generator.get_state(),
        }

    @classmethod
    def restore(cls, state: dict, decoder: Decoder, spec, task_of: Callable[[int], Any], **kw) -> Rollout:
        """A rollout continuing from `state` (made by :meth:`state`); `task_of(task_id)` gives a task back.

        Each environment is rebuilt by replaying its episode's actions (:func:`replay`); an episode whose
        environment does not give the same observations again raises :class:`lrl.episode.ReplayError`. Episodes that were
        waiting on their tool have it called again, with the time it still had to run.
        """
        rollout = cls(decoder, spec, version=state["version"], **kw)
        rollout.generator.set_state(state["generator"])
        if state["clock"] is not None:
            rollout.clock.t = state["clock"]
        rollout.next_key = state["next_key"]
        rollout.decode_steps = state["decode_steps"]
        now = time.monotonic()
        for saved in state["slots"]:
            episode = Episode.from_state(saved["episode"], task_of(saved["episode"]["task_id"]))
            answered = episode.actions if saved["phase"] not in (BARRIER, TOOL) else episode.actions[:-1]
            env = replay(spec.make(), episode, answered)
            slot = _Slot(episode, env, saved["phase"], list(saved["action"]), 0, now - episode.seconds)
            rollout.slots[saved["key"]] = slot
            if saved.get("env") is not None:
                env.load_state(saved["env"])
            if saved["phase"] == TOOL:
                tool = saved["tool"] or {"remaining": 0.0, "times_out": False}
                rollout.tools.submit(saved["key"], env, slot.action, tool["remaining"], tool["times_out"])
        return rollout


def run_episodes(
    decoder: Decoder,
    spec,
    tasks: Sequence[Any],
    generator: torch.Generator,
    sampling: Sampling | None = None,
    version: int = 0,
    *,
    slots: int | None = None,
    lockstep: bool = True,
    tools=None,
    clock=None,
    draws=None,
) -> list[Episode]:
    """Roll out one episode per task with `decoder` -> the episodes in task order; every generated token is
    tagged with `version`.

    By default all episodes start together and advance in lockstep turns. With ``slots``, at most that many are
    in flight, each continuing on its own (``lockstep=False``), and the next task starts as soon as one ends;
    ``tools`` runs the environments' steps (:mod:`lrl.envs.workers`); ``draws`` (:class:`lrl.streams.KeyedDraws`)
    keys each token's uniform by its episode (its place in `tasks`), turn and position instead of drawing in order.
    """
    rollout = Rollout(
        decoder, spec, (), generator, sampling, version, lockstep=lockstep, tools=tools, clock=clock, draws=draws
    )
    queued = list(enumerate(tasks))
    finished: list[Episode] = []
    while queued or not rollout.done:
        room = rollout.room(slots or 0)
        if queued and room:
            start, queued = queued[:room], queued[room:]
            rollout.add([t for _, t in start], tags=[i for i, _ in start])
        finished += rollout.advance()
    return sorted(finished, key=lambda e: e.tag)
