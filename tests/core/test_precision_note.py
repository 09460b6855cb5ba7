"""The run's first lines say what it computes in, on the device it will compute on."""

import types

import torch

from lrl.config import Config
from lrl.run import startup_notes


def notes(cfg: Config, run) -> list[str]:
    return startup_notes(cfg.policy, cfg.sampling, cfg.environment, cfg.run.accelerator, run)


def test_the_precision_note_names_the_device_the_run_will_compute_on(monkeypatch, tmp_path):
    """The module is still on the CPU when the notes are written: a GPU run's note names the GPU, not the CPU."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU 80GB")
    run = types.SimpleNamespace(
        policy=torch.nn.Linear(4, 4),
        module=types.SimpleNamespace(precision="bf16", memory=None, device="cpu"),
    )
    gpu = [
        n
        for n in notes(Config(accelerator="gpu", model=str(tmp_path)), run)
        if n.startswith("precision:")
    ]
    cpu = [
        n
        for n in notes(Config(accelerator="cpu", model=str(tmp_path)), run)
        if n.startswith("precision:")
    ]
    assert gpu and "Test GPU 80GB" in gpu[0]
    assert cpu and "Test GPU 80GB" not in cpu[0]


def test_fp16_autocast_computes_float16_on_this_cpu():
    """Measured, not assumed: torch's CPU autocast gives float16 products here, so precision fp16 is accepted."""
    from lrl import precision

    assert precision.fp16_problem("cpu") is None
    layer = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    with precision.autocast("fp16"):
        y = layer(x)
    assert y.dtype == torch.float16
    rounded = x.half().float() @ layer.weight.half().float().T + layer.bias.half().float()
    assert torch.allclose(y.float(), rounded, atol=1e-2)
    with precision.autocast("bf16"):
        assert layer(x).dtype == torch.bfloat16
    assert precision.describe("fp16").startswith("precision: fp16 autocast")


def test_fp16_is_refused_in_one_line_where_autocast_cannot_run_it(monkeypatch):
    from helpers import FAST, one_clear_line, train

    from lrl import precision

    message = "precision: fp16 autocast on this cpu computes in torch.float32, not float16 (torch test)"
    monkeypatch.setattr(precision, "fp16_problem", lambda device_type="cpu": message)
    out = train(*FAST, "--precision", "fp16", "--eval-at-start", "false")
    one_clear_line(out, 2, message)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
