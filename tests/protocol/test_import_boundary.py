"""glimmer.protocol is pure text: other engines reuse it without torch (style.md, issue 3)."""

import json
import subprocess
import sys

FORBIDDEN_MODULES = (
    "torch",
    "transformers",
    "glimmer.engine",
    "glimmer.model",
    "glimmer.server",
    "glimmer.checkpoint",
    "numpy",
)


def test_importing_glimmer_protocol_imports_no_torch_nor_higher_layers():
    probe = (
        "import json, sys\n"
        "import glimmer.protocol\n"
        "from glimmer.protocol import parse_output, render_chat, builtin_template_source\n"
        "render_chat([{'role': 'user', 'content': 'hi'}], template=builtin_template_source(),"
        " current_date='2026-01-01')\n"
        "parse_output(' to=self<|message|>x<|eom|>')\n"
        f"print(json.dumps([name for name in {FORBIDDEN_MODULES!r} if name in sys.modules]))\n"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(completed.stdout.strip().splitlines()[-1]) == []


def test_builtin_template_ships_as_package_data():
    from glimmer.protocol import builtin_template_source

    source = builtin_template_source()
    assert source.startswith("{#-")
    assert "<|start|>assistant" in source
