"""vLLM's metric names are written once (vlmserve/vllm_names.py): a renamed metric is one edit."""

from __future__ import annotations

import re
from pathlib import Path

import vlmserve

SOURCE = Path(vlmserve.__file__).parent
NAME_LITERAL = re.compile(r"""["']vllm:[a-z_]+["']""")


def test_no_module_but_the_names_module_writes_a_vllm_metric_name() -> None:
    found = [
        f"{path.relative_to(SOURCE)}:{number}: {line.strip()}"
        for path in sorted(SOURCE.rglob("*.py"))
        if path.name != "vllm_names.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if NAME_LITERAL.search(line)
    ]
    assert not found, "write vLLM metric names in vlmserve/vllm_names.py:\n" + "\n".join(found)


def test_the_names_module_holds_the_names_it_is_scanned_for() -> None:
    assert NAME_LITERAL.search((SOURCE / "vllm_names.py").read_text())
