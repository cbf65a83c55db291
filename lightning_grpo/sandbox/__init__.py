"""Execution infrastructure for untrusted model output: the kernel sandbox (``runner.py``), the namespaces it
puts a program in (``isolation.py``), the child side that runs inside them (``_boot.py``) and the sandboxed
Python interpreter tool (``python_tool.py``). Used by the code reward and the tool engine; knows no verdicts."""

from lightning_grpo.sandbox.records import SandboxResult, decode_value
from lightning_grpo.sandbox.runner import Case, Sandbox

__all__ = ["Case", "Sandbox", "SandboxResult", "decode_value"]
