"""The embedded demos, built in code (nothing downloaded): the tiny model and "largest digit" task (``tiny.py``)
and the calculator tool task (``calc.py``). ``resolve`` turns an embedded name into the directory it is written
to, so the demos load through exactly the path a user's model and data take."""

from lightning_grpo.demo.tiny import EMBEDDED, materialize, resolve

__all__ = ["EMBEDDED", "materialize", "resolve"]
