"""Triton packaging and serving: repository rendering, the server launcher, python-backend models.

* ``render``   recipe → typed :class:`ServingInputs` → rendered model repository (strict templates)
* ``server``   :class:`TritonServer`, a context manager around a real ``tritonserver`` process
* ``backend_*`` the logic of the python-backend models (``model_repository/*/1/model.py`` are thin)
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
