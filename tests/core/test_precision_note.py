"""The run's first lines say what it computes in, on the device it will compute on."""

import types

import torch

from lrl.config import Config
from lrl.run import startup_notes


def test_the_precision_note_names_the_device_the_run_will_compute_on(monkeypatch, tmp_path):
    """The module is still on the CPU when the notes are written: a GPU run's note names the GPU, not the CPU."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU 80GB")
    run = types.SimpleNamespace(
        policy=torch.nn.Linear(4, 4),
        module=types.SimpleNamespace(precision="bf16", memory=None, device="cpu"),
    )
    gpu = [
        n
        for n in startup_notes(Config(accelerator="gpu", model=str(tmp_path)), run)
        if n.startswith("precision:")
    ]
    cpu = [
        n
        for n in startup_notes(Config(accelerator="cpu", model=str(tmp_path)), run)
        if n.startswith("precision:")
    ]
    assert gpu and "Test GPU 80GB" in gpu[0]
    assert cpu and "Test GPU 80GB" not in cpu[0]
