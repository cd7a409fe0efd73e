"""How ORTTrainerMixin takes the arguments of whichever ``Trainer`` subclass it is mixed into.

A trainer subclass has its own parameter order (``DPOTrainer(model, ref_model, args, ...)``) and
its own config class (``SFTConfig``), which it may rebuild from any other ``TrainingArguments``,
dropping fields it does not know. So the mixin binds the caller's arguments to the parent's
signature, and hands the parent its own config class with the ORT fields added
(``ORT<Config>(ORTTrainingArguments, <Config>)``), never a plain ``ORTTrainingArguments``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import typing

from transformers import TrainingArguments

from .training_args import ORTTrainingArguments

# Named ORT config classes for known parents (imported lazily: TRL is optional); any other config
# class gets one derived on first use by ort_args_class_for.
_NAMED = {
    "transformers.training_args.TrainingArguments": "ort_hf.trainer.training_args:ORTTrainingArguments",
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments": "ort_hf.trainer.seq2seq:ORTSeq2SeqTrainingArguments",
    "trl.trainer.sft_config.SFTConfig": "ort_hf.trl.configs:ORTSFTConfig",
    "trl.trainer.dpo_config.DPOConfig": "ort_hf.trl.configs:ORTDPOConfig",
    "trl.trainer.grpo_config.GRPOConfig": "ort_hf.trl.grpo:ORTGRPOConfig",
    "trl.trainer.rloo_config.RLOOConfig": "ort_hf.trl.rloo:ORTRLOOConfig",
}
_DERIVED: dict[type, type] = {}


def ort_args_class_for(config_cls: type) -> type:
    """``config_cls`` with the ORT options added: a dataclass ``ORT<Name>(ORTTrainingArguments, config_cls)``
    (the named one, e.g. ``ORTSFTConfig``, where ort_hf has it). Its values and validation are both
    classes'; ORT's ``__post_init__`` runs first and calls the config's."""
    if issubclass(config_cls, ORTTrainingArguments):
        return config_cls
    if not issubclass(config_cls, TrainingArguments):
        raise TypeError(f"{config_cls.__name__} is not a TrainingArguments class.")
    named = _NAMED.get(f"{config_cls.__module__}.{config_cls.__qualname__}")
    if named is not None:
        module, name = named.split(":")
        return getattr(importlib.import_module(module), name)
    if config_cls not in _DERIVED:
        name = f"ORT{config_cls.__name__}"
        while hasattr(sys.modules[__name__], name):  # two configs of one name from different packages
            name += "_"
        derived = dataclasses.make_dataclass(name, [], bases=(ORTTrainingArguments, config_cls))
        derived.__module__ = __name__
        derived.__doc__ = f"``{config_cls.__name__}`` with the ORT options of ``ORTTrainingArguments``."
        # Importable by name: the Trainer saves the args (training_args.bin).
        setattr(sys.modules[__name__], name, derived)
        _DERIVED[config_cls] = derived
    return _DERIVED[config_cls]


def parent_init(trainer: object, mixin: type):
    """The ``__init__`` that names the ``args`` parameter the mixin hands over to: the next one after
    ``mixin`` in ``trainer``'s MRO, past those that pass ``*args, **kwargs`` on (a user's
    ``def __init__(self, *args, class_weights=None, **kwargs)``). Returns it and the keyword-only
    parameters of the ones passed (theirs, not the named one's)."""
    mro = type(trainer).__mro__
    own: set[str] = set()
    for cls in mro[mro.index(mixin) + 1:]:
        init = vars(cls).get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters
        if not _passes_args_on(parameters):
            return init, own
        own |= {n for n, p in parameters.items() if p.kind == inspect.Parameter.KEYWORD_ONLY}
    return object.__init__, own


def _passes_args_on(parameters) -> bool:
    kinds = [p.kind for n, p in parameters.items() if n != "self"]
    return (inspect.Parameter.VAR_POSITIONAL in kinds and inspect.Parameter.VAR_KEYWORD in kinds
            and all(k in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD,
                          inspect.Parameter.KEYWORD_ONLY) for k in kinds))


def bind_trainer_arguments(parent, ort_args_class: type | None, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args`` / ``kwargs`` for the parent's ``init``, with its ``args`` parameter turned into an ORT
    config of the parent's own class (``ort_args_class`` if the trainer names one). ``parent`` is
    :func:`parent_init`'s answer: the ``__init__`` naming ``args``, and the keyword-only parameters of
    the subclasses between, which are passed on as given."""
    init, own = parent
    signature = inspect.signature(init)
    if "args" not in signature.parameters:
        raise TypeError(f"ORTTrainerMixin needs a Trainer whose __init__ takes `args` (the TrainingArguments); "
                        f"{init.__qualname__} does not.")
    theirs = {k: v for k, v in kwargs.items() if k in own}
    try:
        bound = signature.bind(None, *args, **{k: v for k, v in kwargs.items() if k not in own})  # None: self
    except TypeError:
        return args, kwargs  # the parent raises its own error for a wrong call
    expected = parent_config_class(init)
    target = ort_args_class or ort_args_class_for(expected)
    bound.arguments["args"] = as_ort_args(bound.arguments.get("args"), target, expected)
    return bound.args[1:], {**bound.kwargs, **theirs}


def parent_config_class(init) -> type:
    """The most specific ``TrainingArguments`` class the parent's ``args`` annotation names
    (``SFTConfig`` for ``SFTConfig | TrainingArguments | None``); ``TrainingArguments`` if none."""
    annotation = inspect.signature(init).parameters["args"].annotation
    found = [c for c in _classes(annotation, getattr(inspect.unwrap(init), "__globals__", {}))
             if isinstance(c, type) and issubclass(c, TrainingArguments)]
    for cls in found:
        if all(issubclass(cls, other) for other in found):
            return cls
    return TrainingArguments


def _classes(annotation, namespace: dict) -> list:
    if isinstance(annotation, str):
        return [c for part in annotation.split("|") for c in _classes(namespace.get(part.strip().strip("'\"")),
                                                                        namespace)]
    if isinstance(annotation, typing.ForwardRef):
        return _classes(annotation.__forward_arg__, namespace)
    parts = typing.get_args(annotation)
    if parts:
        return [c for part in parts for c in _classes(part, namespace)]
    return [annotation]


def as_ort_args(args: TrainingArguments | None, target: type, expected: type = TrainingArguments):
    """``args`` as an instance of ``target``: unchanged when it already is one (or is an ORT config
    of the parent's class); otherwise rebuilt with every value it was given, the ORT defaults added."""
    if args is None:
        return target(output_dir="trainer_output")
    if isinstance(args, target) or (isinstance(args, ORTTrainingArguments) and isinstance(args, expected)):
        return args
    if not isinstance(args, TrainingArguments):
        raise TypeError(f"`args` must be a TrainingArguments ({target.__name__}), got {type(args).__name__}.")
    if isinstance(args, expected) and not issubclass(target, type(args)):
        target = ort_args_class_for(type(args))  # a subclass of the parent's config: keep its own fields too
    known = {f.name for f in dataclasses.fields(target) if f.init}
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init and f.name in known}
    return target(**values)
