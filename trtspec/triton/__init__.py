"""Triton packaging and serving: repository rendering, the server launcher, python-backend models.

* ``render``   recipe → typed :class:`ServingInputs` → rendered model repository (strict templates)
* ``server``   :class:`TritonServer`, a context manager around a real ``tritonserver`` process
* ``backend_*`` the logic of the python-backend models (``model_repository/*/1/model.py`` are thin)
"""
