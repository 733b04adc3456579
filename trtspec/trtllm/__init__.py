"""TensorRT-LLM builds: pure argv/YAML generation plus one checked runner.

- :mod:`~trtspec.trtllm.commands`: argv builders (quantize.py, convert_checkpoint.py, trtllm-build).
- :mod:`~trtspec.trtllm.llmapi`: LLM-API options (``--extra_llm_api_options`` YAML, Triton llmapi model.yaml).
- :mod:`~trtspec.trtllm.plan`: the stage graph as data (:func:`make_plan`, :func:`describe`).
- :mod:`~trtspec.trtllm.runner`: runs argv lists, stages cached by content hash, atomic folders.
- :mod:`~trtspec.trtllm.build`: version gate, preflight, run, hand-off manifest.
- :mod:`~trtspec.trtllm.handoff`: :class:`TrtllmBuild`, the manifest ``trtspec package`` reads.
- :mod:`~trtspec.trtllm.accepted_names`: flags and keys TRT-LLM 1.2.x accepts, with their sources.

Import the submodules themselves: this package imports nothing eagerly, so the fake tools in the
tests and ``python3 -m trtspec.trtllm.calibration`` start fast.
"""
