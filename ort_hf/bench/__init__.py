"""``ort-hf bench``: throughput, memory, export time and loss agreement of ORTTrainer against
plain PyTorch (eager, torch.compile, a hand-written masked-head MLM) through the same Trainer
loop, each run in a fresh worker process. Benchmarks, not tests: nothing here asserts a speed.

Modules: ``spec`` (workloads, variants, settings), ``sources``/``data``/``models`` (what a
worker trains), ``worker`` (one run, one process), ``timing``, ``runner`` (the processes),
``summary`` (ratios, targets), ``render`` (markdown, JSON, PNG), ``main`` (the command).
"""
