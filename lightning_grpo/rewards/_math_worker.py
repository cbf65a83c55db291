"""Child side of ``math_verify_reward``: JSON lines ``{"gold", "answer"}`` on stdin -> ``{"score"}`` lines on stdout.

Started by ``math_equivalence.py`` as ``python -I _math_worker.py``; imports math-verify, not ``lightning_grpo``
(which would pull in torch). math-verify's own timeouts are off: they use ``signal.alarm`` (main thread only)
and raise a ``BaseException``. The parent times each request and kills this process when one runs too long.
"""

import json
import logging
import os
import resource
import sys
import threading
import time

from latex2sympy2_extended import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# \boxed{} first, then any LaTeX, then a plain expression ("The answer is 42").
ANSWER_CONFIG = [
    LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0),
    ExprExtractionConfig(),
]


def score(gold, answer):
    """1.0 / 0.0 for an equivalent / different answer, None when the gold answer does not parse."""
    gold_parsed = parse(gold, parsing_timeout=None)
    if not gold_parsed:
        return None
    try:
        answer_parsed = parse(answer, extraction_config=ANSWER_CONFIG, parsing_timeout=None)
        return float(verify(gold_parsed, answer_parsed, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - an answer sympy cannot handle is a wrong answer
        return 0.0


def exit_when_orphaned(parent):
    """A hung sympy call would keep an orphan spinning after the trainer dies; a thread checks every second."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main():
    memory_bytes = int(sys.argv[1]) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))  # sympy on a huge power can eat memory
    logging.disable(logging.WARNING)  # "Timeout is disabled" on every call
    threading.Thread(target=exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = score(request["gold"], request["answer"])
        except Exception:  # noqa: BLE001 - an unparseable gold answer is "not applicable"
            result = None
        print(json.dumps({"score": result}), flush=True)


if __name__ == "__main__":
    main()
