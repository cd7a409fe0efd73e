"""``aten::einsum`` of one or two operands as ``Transpose`` / ``ReduceSum`` / ``MatMul``, which ORT
can differentiate.

ORT 1.19.2 has no gradient for ONNX ``Einsum``. Its own ``einsum`` symbolic (which this entry replaces
in ORT's table) exports two operands with an explicit output and no ellipsis as ``MatMul``, and is
still used for them; an ellipsis or a single operand left an ``Einsum``, so a model that trains
through one (LongT5's local and transient-global attention, ``"...qhd,...khd->...hqk"``) could not
train through ORT. This module takes those. Each operand first sums the labels only it
has and the output lacks; then one ``MatMul`` contracts the pair (:func:`_pair`), and the result is
transposed to the output's order: the pairwise contraction torch's own einsum performs with
``bmm``, so no larger intermediate than torch's.

Anything else keeps torch's ``Einsum`` (ORT then refuses to train through it, before training): three
or more operands, a label repeated within an operand (a diagonal), more than one contracted label (a
reshape this does not do), bool operands, or a contracted label whose sizes differ at export (a
broadcast over a summed dimension).
"""

from __future__ import annotations

import torch

from .graph_ops import const, exporter_helpers, torch_symbolics

_ELLIPSIS = "..."


def _parse(equation: str, ranks: list[int]):
    """Each operand's labels, ellipsis dims as ``("...", i)`` over the widest ellipsis (an operand
    whose ``...`` covers fewer dims gets the leading ones as size-1 dims, torch's broadcast), the
    ``(position, count)`` of those dims to insert per operand, and the output's labels; None where
    this module does not handle the equation."""
    inputs, arrow, output = equation.replace(" ", "").partition("->")
    terms = inputs.split(",")
    if len(terms) != len(ranks):
        return None
    widths = [rank - len(t.replace(_ELLIPSIS, "")) if _ELLIPSIS in t else 0 for t, rank in zip(terms, ranks)]
    width = max(widths, default=0)
    ellipsis = [(_ELLIPSIS, i) for i in range(width)]
    operands, inserts = [], []
    for term, own in zip(terms, widths):
        before, dots, after = term.partition(_ELLIPSIS)
        operands.append([*before, *(ellipsis if dots else []), *after])
        inserts.append((len(before), width - own) if dots else (0, 0))
    if any(len(set(o)) != len(o) for o in operands):
        return None  # a diagonal
    if arrow:
        if width and _ELLIPSIS not in output:
            return None  # ellipsis dims summed out: left to torch's Einsum
        before, dots, after = output.partition(_ELLIPSIS)
        out = [*before, *(ellipsis if dots else []), *after]
    else:  # implicit output: the ellipsis, then the labels used once, alphabetically
        letters = [label for o in operands for label in o if isinstance(label, str)]
        out = ellipsis + sorted(label for label in set(letters) if letters.count(label) == 1)
    return operands, inserts, out


def _reduce_sum(g, x, axes: list[int]):
    if not axes:
        return x
    return g.op("ReduceSum", x, const(g, axes, torch.int64), keepdims_i=0)


def _transpose(g, x, order: list[int]):
    return x if order == list(range(len(order))) else g.op("Transpose", x, perm_i=order)


def _sum_own(g, x, labels: list, keep: set):
    """``x`` with the labels not in ``keep`` summed out; returns it and its remaining labels."""
    axes = [i for i, label in enumerate(labels) if label not in keep]
    return _reduce_sum(g, x, axes), [label for label in labels if label in keep]


def _pair_fits(a_labels, b_labels, out) -> bool:
    """Whether, after each operand sums its own labels, at most one label is contracted (more would
    need a reshape)."""
    return len([label for label in a_labels if label in b_labels and label not in out]) <= 1


def _layout(g, x, labels: list, order: list):
    """``x`` transposed to ``order``'s labels it has, with a size-1 dim where it lacks one (``None``
    stands for a dim none has)."""
    present = [label for label in order if label in labels]
    x = _transpose(g, x, [labels.index(label) for label in present])
    missing = [i for i, label in enumerate(order) if label not in labels]
    return g.op("Unsqueeze", x, const(g, missing, torch.int64)) if missing else x


def _pair(g, a, a_labels, b, b_labels, out):
    """The two-operand contraction as one ``MatMul``: ``[batch, row, contracted] @ [batch, contracted,
    col]``. The row and column are one label kept from each operand; the other kept labels ride as
    batch dims, size 1 on the operand without them (``MatMul`` broadcasts its batch dims)."""
    a, a_left = _sum_own(g, a, a_labels, set(b_labels) | set(out))
    b, b_left = _sum_own(g, b, b_labels, set(a_labels) | set(out))
    contracted = [label for label in a_left if label in b_left and label not in out]
    a_only = [label for label in out if label in a_left and label not in b_left]
    b_only = [label for label in out if label in b_left and label not in a_left]
    row, col = a_only[-1:] or [None], b_only[-1:] or [None]
    batch = [label for label in out if label not in row + col]
    k = contracted or [None]
    a = _layout(g, a, a_left, batch + row + k)
    b = _layout(g, b, b_left, batch + k + col)
    y = g.op("MatMul", a, b)  # [batch, row or 1, col or 1]
    y_labels = batch + row + col
    squeeze = [i for i, label in enumerate(y_labels) if label is None]
    if squeeze:
        y = g.op("Squeeze", y, const(g, squeeze, torch.int64))
        y_labels = [label for label in y_labels if label is not None]
    return _transpose(g, y, [y_labels.index(label) for label in out])


def _contracted_sizes_differ(operands, tensors, out, symbolic_helper) -> bool:
    sizes = {}
    for labels, tensor in zip(operands, tensors):
        known = symbolic_helper._get_tensor_sizes(tensor)
        if known is None:
            continue
        for label, size in zip(labels, known):
            if label not in out and size is not None:
                if sizes.setdefault(label, size) != size:
                    return True
    return False


def _decompose(g, equation, tensors):
    symbolic_helper, _ = exporter_helpers()
    if not 1 <= len(tensors) <= 2 or any(symbolic_helper._is_bool(t) for t in tensors):
        return None
    ranks = [symbolic_helper._get_tensor_rank(t) for t in tensors]
    if None in ranks:
        return None
    parsed = _parse(equation, ranks)
    if parsed is None:
        return None
    operands, inserts, out = parsed
    given = [labels[:at] + labels[at + count :] for labels, (at, count) in zip(operands, inserts)]
    if _contracted_sizes_differ(given, tensors, out, symbolic_helper):
        return None
    if len(tensors) == 2 and not _pair_fits(operands[0], operands[1], out):
        return None
    for i, (at, count) in enumerate(inserts):
        if count:
            tensors[i] = g.op("Unsqueeze", tensors[i], const(g, list(range(at, at + count)), torch.int64))
    if len(tensors) == 1:
        x, labels = _sum_own(g, tensors[0], operands[0], set(out))
        return _transpose(g, x, [labels.index(label) for label in out])
    return _pair(g, tensors[0], operands[0], tensors[1], operands[1], out)


def einsum(g, equation, tensor_list, path=None):
    symbolic_helper, _ = exporter_helpers()
    equation = symbolic_helper._parse_arg(equation, "s")
    tensors = symbolic_helper._unpack_list(tensor_list)
    output = equation.partition("->")[2].strip()
    if len(tensors) == 2 and "->" in equation and "." not in equation and output:
        # ORT's own symbolic (the one this entry replaces) turns these into MatMul, reshaping any number
        # of contracted labels; it leaves an Einsum for an ellipsis or one operand, which this module takes.
        from onnxruntime.training.ortmodule._custom_op_symbolic_registry import einsum_internal

        return einsum_internal(g, equation, tensor_list)
    result = _decompose(g, equation, list(tensors))
    if result is not None:
        return result
    return torch_symbolics(12)._einsum_helper(g, equation, tensors)
