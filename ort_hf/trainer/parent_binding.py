"""How ORTTrainerMixin takes the arguments of whichever ``Trainer`` subclass it is mixed into.

A trainer subclass has its own parameter order (``DPOTrainer(model, ref_model, args, ...)``) and
its own config class (``SFTConfig``), which it may rebuild from any other ``TrainingArguments``,
dropping fields it does not know. So the mixin binds the caller's arguments to the parent's
signature, and hands the parent its own config class with the ORT fields added
(``ORT<Config>(ORTTrainingArguments, <Config>)``), never a plain ``ORTTrainingArguments``: the one
ort_hf declares (``ORTSFTConfig``), or one made from the two classes on first use. A user's own
config is the same pattern written out, ``class MyConfig(ORTTrainingArguments, TheirConfig)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import sys
import types
import typing
import warnings

from transformers import TrainingArguments

from .training_args import ORTTrainingArguments

# The module of ort_hf that declares the ORT configs of a library's config classes, by the library's
# top-level package: ``ORT<Config>(<base>, <Config>)`` dataclasses, and as ``ORT_ARGUMENTS_BASE`` the
# base that library's other configs derive from (ORTTrainingArguments when it names none).
_CONFIG_MODULES = {"transformers": "ort_hf.trainer.seq2seq", "trl": "ort_hf.trl.configs"}
_DERIVED: dict[type, type] = {}


def ort_args_class_for(config_cls: type) -> type:
    """``config_cls`` with the ORT options added: the class ort_hf declares for it (``ORTSFTConfig``
    for ``SFTConfig``), or else a dataclass ``ORT<Name>(<base>, config_cls)`` made on first use. Its
    values and validation are both classes'; ORT's ``__post_init__`` runs first and calls the config's."""
    if issubclass(config_cls, ORTTrainingArguments):
        return config_cls
    if not issubclass(config_cls, TrainingArguments):
        raise TypeError(f"{config_cls.__name__} is not a TrainingArguments class.")
    if config_cls is TrainingArguments:
        return ORTTrainingArguments
    base = _library_base(config_cls)  # imports the library's ORT config module: its classes are then found
    declared = [
        cls
        for cls in _subclasses(ORTTrainingArguments)
        if cls.__bases__[1:] == (config_cls,) and cls.__module__ in _CONFIG_MODULES.values()
    ]
    if declared:
        return declared[0]
    if config_cls not in _DERIVED:
        name = f"ORT{config_cls.__name__}"
        while hasattr(sys.modules[__name__], name):  # two configs of one name from different packages
            name += "_"
        derived = dataclasses.make_dataclass(name, [], bases=(base, config_cls))
        derived.__module__ = __name__
        derived.__doc__ = f"``{config_cls.__name__}`` with the ORT options of ``ORTTrainingArguments``."
        # Importable by name: the Trainer saves the args (training_args.bin).
        setattr(sys.modules[__name__], name, derived)
        _DERIVED[config_cls] = derived
    return _DERIVED[config_cls]


def _library_base(config_cls: type) -> type:
    """The base of an ORT config derived for ``config_cls``: its nearest library's (a user's subclass
    of ``SFTConfig`` gets TRL's), or ORTTrainingArguments."""
    for cls in config_cls.__mro__:
        module = _CONFIG_MODULES.get(cls.__module__.partition(".")[0])
        if module is not None:
            return getattr(importlib.import_module(module), "ORT_ARGUMENTS_BASE", ORTTrainingArguments)
    return ORTTrainingArguments


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def parent_init(trainer: object, mixin: type):
    """The ``__init__`` that names the ``args`` parameter the mixin hands over to: the next one after
    ``mixin`` in ``trainer``'s MRO, past those that pass ``*args, **kwargs`` on (a user's
    ``def __init__(self, *args, class_weights=None, **kwargs)``). Returns it and the keyword-only
    parameters of the ones passed (theirs, not the named one's)."""
    mro = type(trainer).__mro__
    own: set[str] = set()
    for cls in mro[mro.index(mixin) + 1 :]:
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
    return (
        inspect.Parameter.VAR_POSITIONAL in kinds
        and inspect.Parameter.VAR_KEYWORD in kinds
        and all(
            k in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            for k in kinds
        )
    )


def bind_trainer_arguments(parent, ort_args_class: type | None, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args`` / ``kwargs`` for the parent's ``init``, with its ``args`` parameter turned into an ORT
    config of the parent's own class (``ort_args_class`` if the trainer names one). ``parent`` is
    :func:`parent_init`'s answer: the ``__init__`` naming ``args``, and the keyword-only parameters of
    the subclasses between, which are passed on as given."""
    init, own = parent
    signature = inspect.signature(init)
    if "args" not in signature.parameters:
        raise TypeError(
            f"ORTTrainerMixin needs a Trainer whose __init__ takes `args` (the TrainingArguments); "
            f"{init.__qualname__} does not."
        )
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
    found = [c for c in _classes(_args_annotation(init)) if isinstance(c, type) and issubclass(c, TrainingArguments)]
    for cls in found:
        if all(issubclass(cls, other) for other in found):
            return cls
    return TrainingArguments


def _args_annotation(init):
    """The parent's ``args`` annotation, evaluated by ``typing.get_type_hints`` in the parent's module
    (a string under ``from __future__ import annotations``; a ForwardRef in Seq2SeqTrainer's). Only
    that one: another parameter's may name what its module imports under TYPE_CHECKING only."""
    func = inspect.unwrap(init)
    only_args = types.SimpleNamespace(__annotations__={"args": getattr(func, "__annotations__", {}).get("args")})
    try:
        return typing.get_type_hints(only_args, globalns=getattr(func, "__globals__", {}))["args"]
    except NameError:  # names a class its module does not define at run time: no config class to read
        return None


def _classes(annotation) -> list:
    parts = typing.get_args(annotation)
    return [c for part in parts for c in _classes(part)] if parts else [annotation]


def as_ort_args(args: TrainingArguments | None, target: type, expected: type = TrainingArguments):
    """``args`` as an instance of ``target``: unchanged when it already is one (or is an ORT config
    of the parent's class); otherwise rebuilt from the values it was given (:func:`given_values`), the ORT
    defaults added."""
    if args is None:
        return target(output_dir="trainer_output")
    if isinstance(args, target) or (isinstance(args, ORTTrainingArguments) and isinstance(args, expected)):
        return args
    if not isinstance(args, TrainingArguments):
        raise TypeError(f"`args` must be a TrainingArguments ({target.__name__}), got {type(args).__name__}.")
    if isinstance(args, expected) and not issubclass(target, type(args)):
        target = ort_args_class_for(type(args))  # a subclass of the parent's config: keep its own fields too
    known = {f.name for f in dataclasses.fields(target) if f.init}
    return target(**{name: value for name, value in given_values(args).items() if name in known})


def given_values(args: TrainingArguments) -> dict:
    """The init fields of ``args`` its ``__post_init__`` does not derive from the others: those away
    from their default, less each one a fresh instance built without it derives to the same value.
    Passing a derived field back as if set can make ``__post_init__`` raise (``GRPOConfig``:
    ``generation_batch_size`` and ``steps_per_generation`` both set) or freeze a value the others
    should decide."""
    cls, fields = type(args), [f for f in dataclasses.fields(args) if f.init]
    kept = {f.name: getattr(args, f.name) for f in fields if not _same(getattr(args, f.name), _default(f))}
    for name in list(kept):
        try:
            with warnings.catch_warnings(), _quiet_transformers():
                warnings.simplefilter("ignore")
                probe = cls(**{k: v for k, v in kept.items() if k != name})
        except Exception:  # noqa: BLE001, S112 - without it the config is invalid: the value was given
            continue
        if _same(getattr(probe, name), kept[name]):
            del kept[name]
    return kept


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def _same(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - values without a truthy == (tensors): treat as different
        return False


@contextlib.contextmanager
def _quiet_transformers():
    """The probes' own log lines (deprecations, derived-value notices) are not the user's run's."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
