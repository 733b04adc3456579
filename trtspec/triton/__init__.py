"""Triton packaging and serving, split by where the code runs.

* :mod:`.render`     recipe → typed :class:`ServingInputs` → rendered model repository (strict
                     templates from ``templates/``, shipped as package data); CLI process
* :mod:`.placement`  which GPUs / MPI ranks each engine gets (pure; shared by render and launch)
* :mod:`.launch`     the ``tritonserver`` launcher, watchdog and MPI plans; CLI process
* :mod:`.backend`    the python-backend models; inside tritonserver's python stub
* :mod:`.procs`      reading /proc for stub processes (used on both sides)
"""

import locale as _locale

# Triton's python stub embeds Python without calling setlocale(), so LC_CTYPE stays "C" and
# open() decodes files as ASCII — torch and modelopt then fail importing their own UTF-8 sources.
# Take the locale from the environment, as every normal Python process does at startup (no-op
# outside the stub; TritonServer passes a UTF-8 locale to the stubs).
try:
    _locale.setlocale(_locale.LC_CTYPE, "")
except _locale.Error:
    pass
