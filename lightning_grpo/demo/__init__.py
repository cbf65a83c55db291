"""The embedded demos, built in code (nothing downloaded): the tiny model and "largest digit" task (``tiny.py``),
the calculator tool task (``calc.py``), any tool (``anytool.py``), a tiny VLM (``vision.py``). ``registry.py``'s
``resolve`` turns an embedded name into the directory it is written to (``home.py``), so the demos load through
exactly the path a user's model and data take."""

from lightning_grpo.demo.registry import EMBEDDED, materialize, resolve

__all__ = ["EMBEDDED", "materialize", "resolve"]
