"""``python -m trtspec.cli``: the same as the ``trtspec`` command."""

from trtspec.cli.app import main

main()
