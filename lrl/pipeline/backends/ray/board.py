"""The weight board of Ray actors: each version is put into Ray's object store once, and announced.

The same methods as :class:`lrl.pipeline.backends.shared_board.WeightBoard` (``version``, ``publish``, ``publish_state``,
``read``, ``read_newest``, ``wait_for``, ``kept``), so the worker loop runs unchanged inside an actor. The
trainer's publish turns the state dict into numpy arrays (read back from the object store without a copy, at
any size: docs/scaling.md has the costs), puts them once, and announces the version with its object reference
to every actor (a small message, the reference nested so that Ray does not fetch the weights for it). Each
actor keeps the references it was told of, the newest ``keep`` of them, and fetches one only when its schedule
loads that version; free-running workers only ever ask for the newest. Versions no one holds a reference to
are freed by Ray.

The board travels to an actor inside its Setup; pickled, it carries only its references.
"""

from __future__ import annotations

import threading
import time
import warnings

import torch

NUMPY_AS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def to_arrays(state: dict[str, torch.Tensor]) -> list:
    """A state dict -> [(dtype name, numpy array)] in its order; dtypes numpy lacks travel as same-size ints."""
    out = []
    for value in state.values():
        tensor = value.detach().to("cpu").contiguous()
        dtype = tensor.dtype
        if dtype in NUMPY_AS:
            tensor = tensor.view(NUMPY_AS[dtype])
        out.append((str(dtype).removeprefix("torch."), tensor.numpy()))
    return out


def from_arrays(names: list[str], arrays: list) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_arrays` (tensors over the arrays' memory: copy them to keep them)."""
    out = {}
    with warnings.catch_warnings():  # the object store's buffers are read-only; loading copies them
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        for name, (dtype, array) in zip(names, arrays):
            tensor = torch.from_numpy(array)
            wanted = getattr(torch, dtype)
            out[name] = tensor.view(wanted) if wanted in NUMPY_AS else tensor
    return out


class ObjectStoreBoard:
    """Versions of a model's weights in Ray's object store (see the module docstring).

    On the trainer's side `owner` connects to Ray and announces versions to the actors (``connect()``,
    ``announce(version, ref)``); in an actor the board is told of versions by :meth:`update`.
    """

    def __init__(self, model: torch.nn.Module, keep: int = 1, owner=None):
        self.names = list(model.state_dict())
        self.keep = keep
        self.owner = owner
        self.refs: dict = {}  # version -> ObjectRef of its arrays
        self.lock = threading.Lock()
        self.publish_seconds = 0.0

    def __getstate__(self) -> dict:
        with self.lock:
            return {"names": self.names, "keep": self.keep, "refs": dict(self.refs)}

    def __setstate__(self, state: dict) -> None:
        self.names = state["names"]
        self.keep = state["keep"]
        self.refs = dict(state["refs"])
        self.owner = None
        self.lock = threading.Lock()
        self.publish_seconds = 0.0

    @property
    def version(self) -> int:
        """The newest version announced; -1 before any."""
        with self.lock:
            return max(self.refs, default=-1)

    def update(self, version: int, ref) -> None:
        """Remember `version` at `ref`, keeping the newest ``keep`` versions."""
        with self.lock:
            self.refs[version] = ref
            for old in sorted(self.refs)[: -self.keep]:
                del self.refs[old]

    # -- the trainer's side -----------------------------------------------------------------------------
    def publish(self, model: torch.nn.Module, version: int) -> float:
        return self.publish_state(model.state_dict(), version)

    def publish_state(self, state: dict[str, torch.Tensor], version: int) -> float:
        """Put `state` into the object store as `version`, once, and announce it -> seconds it took."""
        start = time.perf_counter()
        ray = self.owner.connect()
        ref = ray.put(to_arrays(state))
        self.update(version, ref)
        self.owner.announce(version, ref)
        self.publish_seconds = time.perf_counter() - start
        return self.publish_seconds

    def kept(self) -> dict[int, dict[str, torch.Tensor]]:
        """Every version kept -> a copy of its weights (a deterministic run's checkpoint)."""
        import ray

        with self.lock:
            refs = dict(self.refs)
        return {
            v: {k: t.clone() for k, t in from_arrays(self.names, ray.get(ref)).items()}
            for v, ref in sorted(refs.items())
        }

    # -- an actor's side --------------------------------------------------------------------------------
    def read(self, model: torch.nn.Module, version: int) -> bool:
        """Load exactly `version` into `model` if it was announced -> whether it did."""
        import ray

        with self.lock:
            ref = self.refs.get(version)
        if ref is None:
            return False
        model.load_state_dict(from_arrays(self.names, ray.get(ref)), strict=True)
        return True

    def read_newest(self, model: torch.nn.Module, known: int) -> int | None:
        """Load the newest version when it is newer than `known` -> it, or None."""
        newest = self.version
        if newest <= known:
            return None
        return newest if self.read(model, newest) else None

    def wait_for(self, model: torch.nn.Module, version: int, alive=lambda: True, poll: float = 0.002) -> None:
        """Block until exactly `version` is announced, and load it; `alive()` is called while waiting."""
        while not self.read(model, version):
            if self.version > version + self.keep - 1:
                raise RuntimeError(f"version {version} is gone from the board (newest {self.version})")
            if not alive():
                raise RuntimeError("the trainer went away while a worker waited for weights")
            time.sleep(poll)
