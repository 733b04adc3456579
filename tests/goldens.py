"""Golden files: compare generated text with the file under tests/golden/; with
TRTSPEC_UPDATE_GOLDEN=1 write it instead (then review the diff)."""

from __future__ import annotations

import os
import pathlib

UPDATE = os.environ.get("TRTSPEC_UPDATE_GOLDEN", "") not in ("", "0")


def check_golden(path: pathlib.Path, text: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"missing golden {path}; generate it with TRTSPEC_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{path} differs from the golden; if intended, regenerate (TRTSPEC_UPDATE_GOLDEN=1)"
