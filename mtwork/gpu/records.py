"""Helpers of `Counters`' records (frozen dataclasses): collections kept unique and
sorted, the merge of two such collections, and records built from dicts with their keys
checked."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields, replace
from typing import Any, TypeVar

Built = TypeVar("Built")


def unique_sorted(items: Iterable[Any], cls: type, name: str, *key: str) -> tuple:
    items = tuple(items)
    for item in items:
        if not isinstance(item, cls):
            raise TypeError(f"Counters({name}=...) takes {cls.__name__} items, got {item!r}")
    keys = [tuple(getattr(i, k) for k in key) for i in items]
    if len(set(keys)) != len(keys):
        duplicate = next(k for k in keys if keys.count(k) > 1)
        shown = duplicate[0] if len(key) == 1 else dict(zip(key, duplicate))
        raise ValueError(f"Counters: {' and '.join(key)} {shown!r} appears twice; merge its "
                         "counts")
    return tuple(sorted(items, key=lambda i: tuple(getattr(i, k) for k in key)))


def merge(a: tuple, b: tuple, *key: str) -> tuple:
    def of(item: Any) -> tuple:
        return tuple(getattr(item, k) for k in key)

    merged = {of(i): i for i in a}
    for item in b:
        k = of(item)
        if k in merged:
            first = merged[k]
            merged[k] = replace(first, **{f.name: getattr(first, f.name) + getattr(item, f.name)
                                          for f in fields(item) if f.name not in key})
        else:
            merged[k] = item
    return tuple(merged.values())


def check_keys(cls: type, data: object, where: str) -> None:
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected a dict, got {type(data).__name__}")
    known = [f.name for f in fields(cls)]
    for key in data:
        if key not in known:
            raise ValueError(f"{where}: unknown key {key!r}; known keys: {', '.join(known)}")


def build(cls: type[Built], data: object, where: str) -> Built:
    check_keys(cls, data, where)
    return cls(**data)
