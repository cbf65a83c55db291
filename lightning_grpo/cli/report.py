"""A run directory's logs -> ``report.png`` and a self-contained ``report.html``, with the run's step split (the
seconds of each stage) beside the step model's prediction for its shape (``cli/step_model.py``).

Reads the run's own logs (``metrics.jsonl``, written by the ``MetricsFile`` callback whatever the logger: CSV,
TensorBoard, MLflow, W&B; else ``metrics.csv`` from a CSVLogger or TensorBoard event files) and ``alerts.jsonl``
written by the alert callbacks; knows nothing about models. ``lightning-grpo report RUN_DIR`` calls it.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

PANELS = [  # (title, y label, series prefixes or names)
    ("Reward", "reward", ["train/reward", "train/rewards/", "val/reward"]),
    ("Reward std", "std", ["train/reward_std"]),
    ("KL to reference", "kl", ["train/kl"]),
    ("Token entropy", "nats", ["train/entropy"]),
    ("Completion length", "tokens", ["train/completions/mean_length"]),
]
OPTIONAL_PANELS = [  # drawn only when the run logged one of their series
    ("Distillation: reverse KL to the teacher", "nats", ["train/distill/reverse_kl", "train/distill/reverse_kl_std"]),
    ("Distillation: top-token agreement (gkd)", "share", ["train/distill/top_agreement"]),
]


@dataclass(frozen=True)
class SplitRow:
    """One stage of the run's step: its measured seconds (the median over the logged steps after the first) and
    the step model's prediction for the run's shape (``None``: a stage the model has no part for)."""

    stage: str
    measured: float
    predicted: float | None

    def error(self) -> str:
        return "" if self.predicted is None or not self.measured else f"{self.predicted / self.measured - 1:+.0%}"


@dataclass
class Report:
    png: Path
    html: Path
    series: dict[str, list[tuple[int, float]]]  # metric -> [(step, value)]
    alerts: list[dict]
    split: list[SplitRow]  # empty when the run logged no stage times (train/time/<stage>_s)
    ranks: int  # the run's trainer ranks (config.yaml's trainer.devices x num_nodes; 1 when not given as numbers)
    servers: int = 0  # the vLLM servers it generated from (config.yaml's VLLMServer base_url); 0: in process

    def split_table(self) -> str:
        """The split as a Markdown table, measured beside predicted, with the error of each."""
        rows = "".join(
            f"| {r.stage} | {r.measured:.4f} | {'' if r.predicted is None else f'{r.predicted:.4f}'} | {r.error()} |\n"
            for r in self.split
        )
        return (
            f"step split, {self.ranks} rank(s){f', {self.servers} vLLM server(s)' if self.servers else ''}: "
            "measured (median s) against the step model (cli/step_model.py)\n"
            f"| stage | measured s | predicted s | error |\n|---|---|---|---|\n{rows}"
        )


def read_series(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar the run logged, from ``metrics.jsonl``, ``metrics.csv`` or TensorBoard event files."""
    if (run_dir / "metrics.jsonl").exists():
        return _from_jsonl(run_dir / "metrics.jsonl")
    if (run_dir / "metrics.csv").exists():
        return _from_csv(run_dir / "metrics.csv")
    events = sorted(run_dir.glob("events.out.tfevents.*"))
    if not events:
        raise FileNotFoundError(
            f"{run_dir} holds neither metrics.jsonl (the MetricsFile callback's) nor metrics.csv nor TensorBoard "
            "event files: give the run's own directory (lightning_logs/version_N, mlruns/<experiment>/<run>, "
            "<wandb project>/<run id>)"
        )
    return _from_tensorboard(events)


def _from_jsonl(path: Path) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key != "step":
                series.setdefault(key, []).append((int(row["step"]), float(value)))
    return series


def _from_csv(path: Path) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key != "step" and value not in ("", None):
                    series.setdefault(key, []).append((int(float(row["step"])), float(value)))
    return series


def _from_tensorboard(events: list[Path]) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, list[tuple[int, float]]] = {}
    for path in events:
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            series.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return series


def panels(series: dict) -> list[tuple[str, str, list[str]]]:
    """The panels of a run's report: every one of ``PANELS``, and those of ``OPTIONAL_PANELS`` it logged."""
    return [*PANELS, *(p for p in OPTIONAL_PANELS if _matching(series, p[2]))]


def _matching(series: dict, patterns: list[str]) -> list[str]:
    names = [
        n
        for n in sorted(series)
        for p in patterns
        if n == p or (p.endswith("/") and n.startswith(p) and n.endswith("/mean"))
    ]
    return list(dict.fromkeys(names))


def step_split(series: dict[str, list[tuple[int, float]]], ranks: int, servers: int = 0) -> list[SplitRow]:
    """The run's stages (``train/time/<stage>_s``; scoring and the rest of the step have no part in the model)
    beside ``step_model.predict`` for its ranks, servers and tokens a step; empty when no stage time was logged."""
    from lightning_grpo.cli.step_model import predict
    from lightning_grpo.metrics import STAGES

    measured = {stage: _steady(series.get(f"train/time/{stage}_s")) for stage in STAGES}
    step = _steady(series.get("train/step_time"))
    if step is None or None in measured.values():
        return []
    tokens = tokens_per_step(series)
    predicted = None if tokens is None else predict(ranks, tokens, servers)
    rows = [SplitRow(stage, seconds, getattr(predicted, stage, None)) for stage, seconds in measured.items()]
    rows.append(SplitRow("rest of the step", step - sum(measured.values()), None))
    return [*rows, SplitRow("step", step, None if predicted is None else predicted.step)]


def tokens_per_step(series: dict[str, list[tuple[int, float]]]) -> float | None:
    """The median tokens a step, every rank's (``train/num_tokens`` is cumulative); ``None`` when not logged twice."""
    tokens = series.get("train/num_tokens", [])
    per_step = [(b - a) / (j - i) for (i, a), (j, b) in zip(tokens, tokens[1:]) if j > i]
    return statistics.median(per_step) if per_step else None


def _steady(points: list[tuple[int, float]] | None) -> float | None:
    """The median of a series over its steps after the first (which builds and allocates what the others reuse)."""
    if not points:
        return None
    return statistics.median(v for _, v in (points[1:] or points))


def run_config(run_dir: Path) -> dict:
    """The ``config.yaml`` the CLI saved beside the run's logs; empty when there is none (a run from Python)."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def run_ranks(run_dir: Path) -> int:
    """The run's trainer ranks (``run_config``): devices x nodes, when both are numbers; else 1."""
    trainer = run_config(run_dir).get("trainer") or {}
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    return devices * nodes if isinstance(devices, int) and isinstance(nodes, int) else 1


def run_servers(run_dir: Path) -> int:
    """The vLLM servers the run generated from (``run_config``): those of its ``VLLMServer`` rollout engine's
    ``base_url``, also inside ``AsyncRollouts``; 0 for any other engine (generation in process)."""
    import inspect

    from lightning_grpo.engines import VLLMServer
    from lightning_grpo.engines.vllm.control import server_urls

    engine = (run_config(run_dir).get("model") or {}).get("rollout_engine")
    while isinstance(engine, dict):
        args = engine.get("init_args") or {}
        if str(engine.get("class_path", "")).endswith("VLLMServer"):
            default = inspect.signature(VLLMServer).parameters["base_url"].default
            return len(server_urls(args.get("base_url", default)))
        engine = args.get("engine")
    return 0


def plot(series: dict[str, list[tuple[int, float]]], alerts: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = panels(series)
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 2.6 * len(shown)), sharex=True)
    for ax, (title, ylabel, patterns) in zip(axes, shown):
        names = _matching(series, patterns)
        for name in names:
            steps, values = zip(*sorted(series[name]))
            ax.plot(steps, values, label=name, marker="o" if name.startswith("val/") else None, markersize=4)
        for alert in alerts:
            ax.axvline(alert["step"], color="red", alpha=0.4, linestyle="--")
        ax.set_title(title if names else f"{title} (not logged)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if names:
            ax.legend(fontsize=7, loc="best")
    axes[-1].set_xlabel("optimizer step" + ("   (red dashes: alerts)" if alerts else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_html(report_png: Path, series: dict, alerts: list[dict], path: Path, split: str = "") -> None:
    image = base64.b64encode(report_png.read_bytes()).decode()
    split = f"<h2>Step split</h2><pre>{html.escape(split)}</pre>" if split else ""
    last = "".join(f"<tr><td>{html.escape(k)}</td><td>{v[-1][1]:.4g}</td></tr>" for k, v in sorted(series.items()))
    fired = "".join(f"<li>{html.escape(a['message'])}</li>" for a in alerts) or "<li>none</li>"
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>GRPO run report</title></head><body>"
        f"<h1>GRPO run report</h1><img src='data:image/png;base64,{image}' alt='training curves'>"
        f"<h2>Alerts</h2><ul>{fired}</ul>{split}<h2>Last values</h2><table>{last}</table></body></html>\n"
    )


def write_report(run_dir: str | Path) -> Report:
    """Write ``report.png`` and ``report.html`` into ``run_dir`` from its logs."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist")
    series = read_series(run_dir)
    alerts_path = run_dir / "alerts.jsonl"
    alerts = [json.loads(line) for line in alerts_path.read_text().splitlines()] if alerts_path.exists() else []
    png, page = run_dir / "report.png", run_dir / "report.html"
    ranks, servers = run_ranks(run_dir), run_servers(run_dir)
    report = Report(png, page, series, alerts, step_split(series, ranks, servers), ranks, servers)
    plot(series, alerts, png)
    write_html(png, series, alerts, page, report.split_table() if report.split else "")
    return report
