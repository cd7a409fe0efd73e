"""``ort-hf bench``: throughput, memory, export time and loss agreement of ORTTrainer against
plain PyTorch (eager, torch.compile, a hand-written masked-head MLM) through the same Trainer
loop, each run in a fresh worker process. Benchmarks, not tests: nothing here asserts a speed.

Modules: ``spec`` (workloads, variants, settings), ``sources``/``data``/``models`` (what a
worker trains), ``worker`` (one run, one process), ``timing``, ``runner`` (the processes),
``summary`` (ratios, break-even points, targets), ``render`` (markdown, JSON, PNG), ``cpu`` (which CPU
kind a result is from) and ``by_cpu`` (every kind's results side by side), ``main`` (the command).
"""
