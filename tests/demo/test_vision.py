"""The vision-language template, run as a user runs it: a tiny LLaVA warm-started to answer a colour letter at chance
learns to read the square's colour (held-out accuracy up 40+ points within 5 minutes on one thread), while the same
run on blanked images (nothing to look at) stays near chance, and the exported model reloads with its processor."""

import json
from pathlib import Path

import pytest
import torch
from helpers import ROOT

from lightning_grpo.cli import main

CONFIG = str(ROOT / "templates" / "vlm_cpu.yaml")


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()  # the template sets one thread in this process
    yield
    torch.set_num_threads(before)


def summary_of(root: Path) -> tuple[dict, Path]:
    run = next(root.glob("lightning_logs/version_*"))
    return json.loads((run / "summary.json").read_text()), run


@pytest.mark.slow
def test_the_template_learns_to_look_and_the_blank_control_does_not(tmp_path, restore_threads):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    main(["fit", "--config", CONFIG, "--trainer.default_root_dir", str(tmp_path / "images")])
    looked, run = summary_of(tmp_path / "images")
    assert looked["accuracy_before"] <= 0.35, looked  # the warm start answers at chance (25% for 4 colours)
    assert looked["accuracy_after"] - looked["accuracy_before"] >= 0.40, looked
    assert looked["wall_time_s"] < 300, looked
    assert not (run / "alerts.jsonl").exists(), (run / "alerts.jsonl").read_text()
    AutoModelForImageTextToText.from_pretrained(run / "hf_model")  # the trained VLM, reloadable with its processor
    assert AutoProcessor.from_pretrained(run / "hf_model").image_processor is not None

    main(
        [
            "fit",
            "--config",
            CONFIG,
            "--data.dataset",
            "lightning-grpo/tiny-colours-blank",
            "--trainer.default_root_dir",
            str(tmp_path / "blank"),
        ]
    )
    blank, _ = summary_of(tmp_path / "blank")
    assert abs(blank["accuracy_after"] - 0.25) <= 0.15, blank  # nothing to look at: chance stays chance
