"""The ``trtspec`` command line: thin click commands over the library, one module per group.

* :mod:`.app`      the group; commands are imported when they run (:data:`.app.COMMANDS`)
* :mod:`.common`   the error boundary, consoles, progress bars
* :mod:`.inspect`  check, doctor, recipes          * :mod:`.models`   models tiny|qwen|eagle3
* :mod:`.runtime`  generate, tune                  * :mod:`.quantize` quantize
* :mod:`.build`    build, package                  * :mod:`.serve`    serve
* :mod:`.measure`  bench, validate                 * :mod:`.deploy`   deploy k8s
* :mod:`.run`      run (the pipeline)
"""

from trtspec.cli.app import main

__all__ = ["main"]
