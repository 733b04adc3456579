"""What runs inside tritonserver's python stub: the logic of the python-backend models.

The templates' ``model.py`` files (``trtspec/triton/templates/*/1/model.py``) are thin: each
subclasses one class here. Nothing in this package imports the launcher (:mod:`trtspec.triton.launch`);
torch is imported only by :mod:`.engine`, and only when a torch-runtime model initializes.
"""
