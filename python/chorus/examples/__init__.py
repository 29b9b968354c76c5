"""Runnable examples on chorus's torch backend (``python -m chorus.examples.<name>``).

- ``train_gpt``: a small GPT trained on CPU ranks with Megatron-style tensor, pipeline (1F1B) and data
  parallelism; ``--print-model-json`` writes the chorus-sim model file of the same shapes.
- ``calibrate``: kernel and transport microbenchmarks of this machine, written as a chorus-sim cluster file.
"""
