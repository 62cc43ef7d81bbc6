"""One JSON line per request, for whoever must answer "what happened to request X?".

Prompts and images stay out unless `log_content` is switched on: a clinic's radiographs and
patient questions must not end up in log files by default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any


class AuditLog:
    """Appends records to a file; line-buffered so a crash loses at most the line being written."""

    def __init__(self, path: Path | None, *, log_content: bool = False) -> None:
        self.log_content = log_content
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1, encoding="utf-8")

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def write(self, record: dict[str, Any], content: Any = None) -> None:
        if self._file is None:
            return
        if self.log_content and content is not None:
            record = {**record, "content": content}
        self._file.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
