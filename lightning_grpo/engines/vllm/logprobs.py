"""Sampling settings -> the vLLM ``logprobs_mode`` whose log-probs are the trainer's, or why none is.

The trainer scores every token under ``softmax(logits / temperature)``, with no filter and no repetition penalty
(``references/concepts.md``, "Sampling filters and the correction"). vLLM returns either ``raw_logprobs`` (the
model's logits, before temperature and every processor) or ``processed_logprobs`` (after temperature, the
penalties and top-k/top-p/min-p). Raw is the trainer's distribution when the temperature is 1; processed is when no
filter is on; with both a temperature other than 1 and a filter, neither is, and a correction would compare two
distributions even when the sampler holds the trainer's weights. Knows ``SamplingConfig``; nothing about vLLM's
objects.
"""

from __future__ import annotations

from lightning_grpo.engines.config import SamplingConfig

RAW = "raw_logprobs"
PROCESSED = "processed_logprobs"
LOGPROBS_MODES = (PROCESSED, RAW)


def filters_on(sampling: SamplingConfig) -> list[str]:
    """The settings of ``sampling`` that change the distribution beyond its temperature, as ``name=value``.

    >>> filters_on(SamplingConfig(top_p=0.9, repetition_penalty=1.1))
    ['sampling.top_p=0.9', 'sampling.repetition_penalty=1.1']
    """
    on = {
        "top_p": sampling.top_p < 1.0,
        "top_k": bool(sampling.top_k),
        "min_p": bool(sampling.min_p),
        "repetition_penalty": sampling.repetition_penalty != 1.0,
    }
    return [f"sampling.{name}={getattr(sampling, name)!r}" for name, active in on.items() if active]


def fitting_modes(sampling: SamplingConfig) -> tuple[str, ...]:
    """The ``logprobs_mode`` values whose log-probs are the trainer's under ``sampling``: raw at temperature 1,
    processed when no filter is on (both at the defaults), none with a temperature other than 1 and a filter.

    >>> fitting_modes(SamplingConfig()), fitting_modes(SamplingConfig(top_k=20))
    (('raw_logprobs', 'processed_logprobs'), ('raw_logprobs',))
    >>> fitting_modes(SamplingConfig(temperature=0.7)), fitting_modes(SamplingConfig(temperature=0.7, top_p=0.9))
    (('processed_logprobs',), ())
    """
    raw = (RAW,) if sampling.temperature == 1.0 else ()
    return raw + (() if filters_on(sampling) else (PROCESSED,))


def logprobs_mode(sampling: SamplingConfig) -> str | None:
    """The ``logprobs_mode`` an engine of its own builds with under ``sampling`` (the first that fits; ``None``
    when none does).

    >>> logprobs_mode(SamplingConfig(top_k=20)), logprobs_mode(SamplingConfig(temperature=0.7))
    ('raw_logprobs', 'processed_logprobs')
    >>> logprobs_mode(SamplingConfig(temperature=0.7, top_p=0.9)) is None
    True
    """
    return next(iter(fitting_modes(sampling)), None)


def mode_problems(engine: str, sampling: SamplingConfig, correction: str | None, mode: str | None) -> list[str]:
    """Why ``engine``'s log-probs (``mode``: the server's; ``None``: chosen from ``sampling``) cannot be compared
    with the trainer's under ``update.sampling_correction=correction``; empty when they can or nothing compares
    them."""
    if correction is None:
        return []
    fitting, filters = fitting_modes(sampling), ", ".join(filters_on(sampling)) or "no filter"
    setting = (
        f"update.sampling_correction={correction!r} with sampling.temperature={sampling.temperature!r} and {filters}"
    )
    if not fitting:
        return [
            f"{setting}: {engine} cannot report the log-probs the trainer computes (softmax(logits / temperature), "
            "unfiltered): vLLM's raw log-probs have no temperature and its processed ones are filtered. Allowed: "
            "sampling.temperature=1.0 with any filter, any temperature without top_p/top_k/min_p/"
            "repetition_penalty, or update.sampling_correction=None"
        ]
    if mode is not None and mode not in fitting:
        return [
            f"{setting}: {engine}(logprobs_mode={mode!r}) reports log-probs the trainer does not compute; start the "
            f"server with --logprobs-mode {fitting[0]} and set logprobs_mode={fitting[0]!r}, or "
            "update.sampling_correction=None"
        ]
    return []
