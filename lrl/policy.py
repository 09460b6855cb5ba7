"""The TinyAgent policy: a transformers causal LM built from a config, or loaded from a local directory."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from lrl.batch import pad_right
from lrl.tokenizers import TOKENIZER_FILE, WordTokenizer

# two heads of 32 (one key/value head) rather than four of 16: the same weight matrices, and a head size that
# real inference engines' CPU attention kernels take (vLLM's accepts 32, 64, ... but not 16; docs/engine.md)
DEFAULT_SIZE = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=256,
)


class ModelLoadError(ValueError):
    """A --model path that does not exist or does not hold a causal LM."""


def make_policy(tok, seed: int = 0, **size) -> torch.nn.Module:
    """A freshly initialised tiny Qwen3ForCausalLM (~150k parameters) over the tokenizer's vocabulary."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tok),
        tie_word_embeddings=True,
        pad_token_id=tok.pad_id,
        bos_token_id=tok.bos_id,
        eos_token_id=tok.eos_id,
        **{**DEFAULT_SIZE, **size},
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.float().eval()


def load_policy(path: str | Path, tok: WordTokenizer | None = None, dtype=torch.float32):
    """Load a local `save_pretrained` directory -> (model, tokenizer). Clear errors for bad paths."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"--model {path}: no such directory")
    if not path.is_dir():
        raise ModelLoadError(f"--model {path}: is a file; it must be a save_pretrained folder")
    if not (path / "config.json").exists():
        raise ModelLoadError(f"--model {path}: not a transformers model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as err:  # transformers raises several types for a broken config
        raise ModelLoadError(f"--model {path}: config.json cannot be read ({err})") from None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(
            f"--model {path}: model type {config.model_type!r} is not a causal LM "
            f"(AutoModelForCausalLM supports e.g. qwen3, llama, gpt2)"
        )
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar per load of a 150k-parameter model is noise on the console
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (
        Exception
    ) as err:  # a truncated file, a shape that does not match config.json, ... : one clear line
        message = " ".join(str(err).split())[:300]
        raise ModelLoadError(
            f"--model {path}: the weights cannot be loaded ({type(err).__name__}: {message})"
        ) from None
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    try:
        check_weights(model)
        check_causal(model)
    except ValueError as err:
        raise ModelLoadError(f"--model {path}: {err}") from None
    if tok is None and ((path / TOKENIZER_FILE).exists() or (path / "tokenizer.json").exists()):
        from lrl.tokenizers import load_tokenizer

        try:
            tok = load_tokenizer(path)
        except ValueError as err:
            raise ModelLoadError(f"--model {path}: {err}") from None
    if tok is not None:
        try:
            check_vocabulary(model, tok)
        except ValueError as err:
            raise ModelLoadError(f"--model {path}: {err}") from None
    return model.eval(), tok


def check_weights(model) -> None:
    """Raise ValueError when a parameter holds NaN or inf (the run would stop at its first sample)."""
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise ValueError(f"{len(bad)} weight tensor(s) hold NaN or inf values (the first: {bad[0]})")


# encoder families whose causal-LM heads attend to later tokens unless their config sets is_decoder
ENCODER_TYPES = {
    "bert",
    "bert-generation",
    "big_bird",
    "camembert",
    "data2vec-text",
    "electra",
    "ernie",
    "megatron-bert",
    "mobilebert",
    "nezha",
    "qdqbert",
    "rembert",
    "roberta",
    "roberta-prelayernorm",
    "roc_bert",
    "roformer",
    "xlm-roberta",
    "xlm-roberta-xl",
    "xmod",
    "modernbert",
}
PROBES = 3  # random probe sequences
PROBE_LENGTH = 12
CAUSAL_TOLERANCE = 1e-2  # earlier logits may move by this share of how much the later ones move (own dtype)
CAUSAL_TOLERANCE_F64 = 1e-9  # ... in float64, where a causal model's earlier logits do not move at all
PROBE_F64_PARAMETERS = 50_000_000  # models up to this size are probed on a float64 copy


@torch.no_grad()
def check_causal(model) -> None:
    """Raise ValueError when the model is not a causal LM, or when its logits on a probe are not finite.

    A bidirectional encoder loaded under a causal-LM head (BERT with is_decoder false) would train and exit 0
    while every log-prob looks at the future. An encoder family whose config does not set ``is_decoder`` is
    refused outright; every other model is probed: in each of several random sequences, every token after a
    split point is changed, and the logits up to the split must stay where they were, up to a small share of
    how much the logits after it moved (rounding, at any weight scale). Logits that overflow (weights scaled
    far beyond any trained model's) are reported as such first: inf - inf is NaN, which would otherwise look
    like a dependence.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", "")
    if model_type in ENCODER_TYPES and not getattr(config, "is_decoder", False):
        raise ValueError(
            f"it is not a causal LM: a {model_type} encoder attends to later tokens unless its config sets "
            "is_decoder: true (set it in config.json, or use a decoder)"
        )
    probe_causal(model)


@torch.no_grad()
def probe_causal(model) -> None:
    """The numerical half of :func:`check_causal`: later tokens must not move earlier logits (ValueError).

    The probe runs in float64 on a copy of a model of up to PROBE_F64_PARAMETERS weights: a randomly initialised
    encoder with tiny weights moves its earlier logits by 1e-7 when later tokens change, below float32 rounding
    at the logits' scale but far above float64's (a causal model's earlier logits do not move at all). A larger
    model is probed in its own dtype, with the tolerance of that dtype's rounding."""
    vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else 0
    if vocab < 4:
        return
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    probes = []
    for probe in range(PROBES):
        ids = torch.randint(1, vocab, (1, PROBE_LENGTH), generator=generator)  # [1, L]
        split = 2 + probe * (PROBE_LENGTH - 4) // max(PROBES - 1, 1)  # positions 0 .. split keep their tokens
        changed = ids.clone()
        shift = torch.randint(1, vocab - 1, (1, PROBE_LENGTH - split - 1), generator=generator)
        changed[:, split + 1 :] = (ids[:, split + 1 :] - 1 + shift) % (
            vocab - 1
        ) + 1  # every later token differs
        probes.append((split, ids.to(device), changed.to(device)))

    def logits(net, x):
        return net(input_ids=x, attention_mask=torch.ones_like(x)).logits[0]  # [L, V]

    for _, ids, changed in probes:  # finite in the model's own arithmetic
        if not (torch.isfinite(logits(model, ids)).all() and torch.isfinite(logits(model, changed)).all()):
            largest = max(p.detach().abs().max().item() for p in model.parameters())
            raise ValueError(
                f"its logits on a probe input are not finite (inf or NaN): the weights are too large for "
                f"{next(model.parameters()).dtype} arithmetic (the largest |weight| is {largest:.3g})"
            )
    small = sum(p.numel() for p in model.parameters()) <= PROBE_F64_PARAMETERS
    net = copy.deepcopy(model).double().eval() if small else model
    tolerance = CAUSAL_TOLERANCE_F64 if small else CAUSAL_TOLERANCE
    for split, ids, changed in probes:
        a, b = logits(net, ids).double(), logits(net, changed).double()
        earlier = (a[: split + 1] - b[: split + 1]).abs().max().item()
        later = (a[split + 1 :] - b[split + 1 :]).abs().max().item()
        if earlier > tolerance * later:
            raise ValueError(
                "it is not a causal LM: its logits at a position depend on later tokens "
                f"({type(model).__name__}: changing the tokens after position {split} moved the logits before "
                f"it by {earlier:.3g}, against {later:.3g} after it; for BERT-like encoders set is_decoder, or "
                "use a decoder)"
            )


def check_vocabulary(model, tok) -> None:
    """Raise ValueError when the model's output vocabulary cannot hold every id of the tokenizer."""
    n = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else 0
    if n < len(tok):
        raise ValueError(f"the model's vocabulary of {n} is smaller than the tokenizer's {len(tok)}")


def save_policy(model, tok, path: str | Path) -> Path:
    """save_pretrained plus the tokenizer (the word list, or the transformers files), so load_policy restores both."""
    from transformers.utils import logging as hf_logging

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar per save of a tiny model is noise on the console
    try:
        model.save_pretrained(path)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    if isinstance(tok, WordTokenizer):
        tok.save(path)
    else:
        tok.hf.save_pretrained(path)
    return path


def selected_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) at `targets`, computed in fp32: [B, T, V], [B, T] -> [B, T]."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def with_fp32_head(model: torch.nn.Module, source: torch.nn.Module) -> torch.nn.Module:
    """Give a low-precision `model` an fp32 LM head with `source`'s weights; its input is cast to fp32."""
    head = source.get_output_embeddings()
    fp32 = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
    fp32 = fp32.to(device=head.weight.device, dtype=torch.float32)
    with torch.no_grad():
        fp32.weight.copy_(head.weight.float())
        if head.bias is not None:
            fp32.bias.copy_(head.bias.float())
    fp32.register_forward_pre_hook(lambda mod, args: (args[0].float(),))
    model.set_output_embeddings(fp32)  # unties it from the (low-precision) input embeddings
    return model


@torch.no_grad()
def continuation_log_probs(
    model, prompts, new_ids: torch.Tensor, pad_id: int, batch_size: int, temperature: float = 1.0
) -> torch.Tensor:
    """Trainer-style log-probs of the continuations: one full forward per `batch_size` right-padded
    sequences -> [B, n]."""
    device = next(model.parameters()).device
    n = new_ids.shape[1]
    seqs = [list(p) + row.tolist() for p, row in zip(prompts, new_ids)]
    groups = [seqs[i : i + batch_size] for i in range(0, len(seqs), batch_size)]
    out = []
    for chunk in groups:
        ids, mask = pad_right(chunk, pad_id)  # [b, T]
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # [b, T, V]
        for row, s in enumerate(chunk):
            first = len(s) - n  # position of the first new token
            target = ids[row, first : len(s)].to(device)
            out.append(selected_log_probs(logits[row, first - 1 : len(s) - 1], target, temperature).cpu())
    return torch.stack(out)
