"""Execution infrastructure for untrusted model output: the kernel sandbox (``runner.py``: ``Sandbox``), the
namespaces it puts a program in (``isolation.py``), the cgroup that bounds it (``cgroups.py``), the child process
it supervises (``supervise.py``), its record stream (``records.py``), the processes inside it (``inside/``) and the
sandboxed Python interpreter tool (``python_tool.py``). Used by the code reward and the tool engine; knows no
verdicts."""

from lightning_grpo.sandbox.records import SandboxResult, decode_value
from lightning_grpo.sandbox.runner import Case, Sandbox

__all__ = ["Case", "Sandbox", "SandboxResult", "decode_value"]
