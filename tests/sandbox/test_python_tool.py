"""The sandbox as a Python interpreter tool: real sandboxed runs, what the model reads back, and escapes refused."""

from __future__ import annotations

import pytest

from lightning_grpo.engines import ToolCall, ToolCalling
from lightning_grpo.engines.multiturn.calls import run_call, tool_schema
from lightning_grpo.sandbox import isolation as sandbox_isolation
from lightning_grpo.sandbox.python_tool import python, python_tool

KERNEL = sandbox_isolation.probe("auto").kernel


def test_schema_describes_the_code_argument():
    for tool in (python, python_tool(timeout_seconds=2)):
        function = tool_schema(tool)["function"]
        assert function["name"] == "python"
        assert function["parameters"]["properties"]["code"]["type"] == "string"
        assert function["parameters"]["required"] == ["code"]
    assert [
        s["function"]["name"] for s in ToolCalling(tools=["lightning_grpo.sandbox.python_tool.python"]).schemas
    ] == ["python"]


def test_the_model_reads_the_output_and_the_error():
    assert python("print(6 * 7)") == "42\n"
    assert python("print('partial'); 1 / 0") == "partial\nZeroDivisionError: division by zero"
    assert python("x = 1") == "(no output)"
    call = run_call(ToolCall("python", {"code": "print(sum(range(10)))"}), {"python": python}, timeout=30)
    assert call.content == "45\n" and not call.failed


def test_a_long_output_keeps_its_end_and_a_hang_times_out():
    tool = python_tool(max_chars=10, timeout_seconds=1.0)
    assert tool("print('x' * 50 + 'END')") == "xxxxxxEND\n"
    assert tool("import time\ntime.sleep(30)") == "timed out after 1.0 s"


@pytest.mark.skipif(not KERNEL, reason="kernel namespaces (bubblewrap) refused on this machine")
def test_a_program_that_tries_to_escape_reads_nothing_of_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_GRPO_TEST_TOKEN", "hunter3")
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    escape = (
        "import os, socket\n"
        f"for path in ({str(secret)!r}, '/etc/hostname', '/root/.bashrc'):\n"
        "    try:\n        print(open(path).read())\n    except OSError as e:\n        print(type(e).__name__)\n"
        "print(sorted(os.environ))\n"
        "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\n"
        "except OSError as e:\n    print('net', e.errno)\n"
        "open('/tmp/planted', 'w').write('x')\n"
        "print(os.getpid())\n"
    )
    out = python(escape)
    assert "hunter2" not in out
    assert out.count("FileNotFoundError") + out.count("PermissionError") == 3, out
    assert "LIGHTNING_GRPO_TEST_TOKEN" not in out and "net 101" in out  # not the host's environment, no network
    assert int(out.split()[-1]) < 10  # its own pid namespace
    assert not (tmp_path / "planted").exists() and not __import__("os").path.exists("/tmp/planted")


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="max_chars must be >= 1, got 0"):
        python_tool(max_chars=0)
    with pytest.raises(ValueError, match="timeout_seconds must be > 0, got -1"):
        python_tool(timeout_seconds=-1)
