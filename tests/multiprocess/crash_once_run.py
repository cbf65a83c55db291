"""A run that dies of a segfault the first time and writes its report the second: ``run_ranks``' one rerun after
a native crash. Args: OUT_DIR."""

import faulthandler
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
if not (out / "crashed").exists():
    (out / "crashed").touch()
    faulthandler._sigsegv()  # what gloo's transport thread did to rank 1 once in CI
(out / "rank0.json").write_text(json.dumps({"ran": "again"}))
