"""``ort-hf sweep``: every model type of transformers' Auto mappings, trained on a tiny config with
``Trainer`` and with ``ORTTrainer`` from the same weights, one cell per type, task and ORT mode
(docs/architectures.md); the classes proven exact go to ort_hf/engine/proven_architectures.json.

Modules: ``cases`` (tasks, modes, the run), ``tiny_config`` (the shrinking table), ``data`` (rows,
tokenizer, collators), ``recording`` (losses, gradients, errors), ``worker`` (one case, one process),
``runner`` (processes, time limits), ``cells`` (verdicts and thresholds), ``results`` (the JSONL),
``render`` (the docs), ``main`` (the command).
"""
