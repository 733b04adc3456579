"""Rewrite README.md's NVIDIA contract table from ``trtspec.triton.contract.markdown_table()``
(``tests/unit/test_contract.py`` fails while the two differ). Usage: ``python scripts/readme_contract_table.py``."""

from __future__ import annotations

import pathlib

from trtspec.triton.contract import markdown_table

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
HEADER = "| tensor | in / out | NVIDIA models | trtspec | notes |"


def main() -> None:
    lines = README.read_text().split("\n")
    start = lines.index(HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    lines[start:end] = markdown_table().split("\n")
    README.write_text("\n".join(lines))
    print(f"{README}: contract table rewritten ({end - start} -> {len(markdown_table().splitlines())} lines)")


if __name__ == "__main__":
    main()
