"""glimmer/__init__.py (and glimmer/multimodal/__init__.py): the packages' names, resolved lazily."""

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["glimmer", "glimmer.multimodal"])
def test_dir_lists_every_exported_name_without_importing_them(package):
    """`dir(glimmer)` listed ['Any', 'TYPE_CHECKING', 'annotations'] alone, so `glimmer.<TAB>` in IPython or Jupyter
    offered neither LLM nor SamplingParams (and `glimmer.multimodal.<TAB>` no MediaLimits). Listing them imports
    nothing (the CLI's help and glimmer.protocol stay free of torch)."""
    probe = ("import sys, json, importlib\n"
             f"package = importlib.import_module({package!r})\n"
             "names = dir(package)\n"
             "print(json.dumps([names, package.__all__, 'torch' in sys.modules]))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names, exported, torch_imported = json.loads(result.stdout)
    assert set(exported) <= set(names) and names == sorted(names)
    assert not torch_imported
