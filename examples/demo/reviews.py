"""A small product-review sentiment dataset written for the ort_hf demo.

Sentences are composed from hand-written openers, product aspects and verdicts. Train and
dev use different aspects, so dev accuracy measures the sentiment words, not memorised
sentences.
"""

from __future__ import annotations

import random

OPENERS = [
    "",
    "Honestly, ",
    "After a month of use, ",
    "I have to say ",
    "To be fair, ",
    "In short, ",
    "My partner agrees: ",
    "Update after two weeks: ",
    "For the price, ",
    "Long story short, ",
]
TRAIN_ASPECTS = [
    "the battery life",
    "the screen",
    "the customer service",
    "the delivery",
    "the sound",
    "the build quality",
    "the instructions",
    "the companion app",
    "the fit",
    "the keyboard",
    "the camera",
    "the charger",
]
DEV_ASPECTS = ["the packaging", "the speakers", "the warranty support", "the touchpad", "the strap", "the remote"]
POSITIVE = [
    "exceeded my expectations",
    "works flawlessly",
    "is a real pleasure to use",
    "feels solid and well made",
    "was better than advertised",
    "made my day easier",
    "is excellent",
    "impressed everyone who tried it",
    "is worth every penny",
    "has been completely reliable",
    "is simply wonderful",
    "is fast and friendly",
]
NEGATIVE = [
    "stopped working after a week",
    "is a total disappointment",
    "feels cheap and flimsy",
    "was worse than advertised",
    "made everything harder",
    "is terrible",
    "broke on the first day",
    "is a waste of money",
    "has been unreliable from the start",
    "is painfully slow",
    "left me angry and frustrated",
    "is simply awful",
]
CLOSERS = ["", " I would buy it again.", " Never again.", " Five stars.", " One star.", ""]


def _sentences(aspects: list[str], rng: random.Random, count: int) -> list[tuple[str, int]]:
    rows = []
    for _ in range(count):
        label = rng.randint(0, 1)
        verdict = rng.choice(POSITIVE if label else NEGATIVE)
        closer = rng.choice(CLOSERS)
        # Keep closers consistent with the label: a mismatched one would be label noise.
        if (label and closer in (" Never again.", " One star.")) or (
            not label and closer in (" I would buy it again.", " Five stars.")
        ):
            closer = ""
        text = f"{rng.choice(OPENERS)}{rng.choice(aspects)} {verdict}.{closer}"
        rows.append((text[0].upper() + text[1:], label))
    return rows


def build_splits(train_size: int = 1200, dev_size: int = 300, seed: int = 7):
    """(train, dev) lists of (sentence, label), label 1 = positive."""
    rng = random.Random(seed)
    return _sentences(TRAIN_ASPECTS, rng, train_size), _sentences(DEV_ASPECTS, rng, dev_size)
