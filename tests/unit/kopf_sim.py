"""kopf as tidal's handlers see it, in process: the handlers registered by `tidal.k8s.handlers`
are found in kopf's registry and called in kopf's order for one object's event (the index
functions, in a worker thread as kopf runs sync handlers; then their results stored in the
indices; then the `on.event` handlers), and timers are fired on demand. Each object gets its own
memo, a shallow copy of the base memo, as kopf makes. A test can stop between an index function
and the store of its result (`index`, then the returned `store`), which is where kopf lets the
event loop (and so another object's timer) run.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kopf
from kopf._core.intents.handlers import TimerHandler

import tidal.k8s.handlers  # noqa: F401  (registers the handlers)


class Index(Mapping):
    """A kopf index: key -> the values of every object indexed under it."""

    def __init__(self) -> None:
        self._items: dict[Any, dict[str, Any]] = {}
        self._keys_of: dict[str, set[Any]] = {}

    def put(self, uid: str, result: dict[Any, Any]) -> None:
        self.discard(uid)
        for key, value in result.items():
            self._items.setdefault(key, {})[uid] = value
        self._keys_of[uid] = set(result)

    def discard(self, uid: str) -> None:
        for key in self._keys_of.pop(uid, ()):
            self._items[key].pop(uid, None)
            if not self._items[key]:
                del self._items[key]

    def __getitem__(self, key: Any) -> list[Any]:
        return list(self._items[key].values())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class MiniKopf:
    def __init__(self, **memo: Any):
        registry = kopf.get_default_registry()
        self.base = kopf.Memo(**memo)
        self.indexers = list(registry._indexing.get_all_handlers())
        self.watchers = list(registry._watching.get_all_handlers())
        self.timers = [h for h in registry._spawning.get_all_handlers() if isinstance(h, TimerHandler)]
        self.indices = {h.id: Index() for h in self.indexers}
        self.memos: dict[str, kopf.Memo] = {}

    # -- one object's event, in kopf's order ------------------------------------------------
    async def index(self, plural: str, body: dict[str, Any], type: str | None = None) -> Callable[[], None]:
        """Run the index functions; returns the step that stores their results (or drops the
        object from the indices, for a deletion)."""
        uid = body["metadata"]["uid"]
        if type == "DELETED":

            def drop() -> None:
                for index in self.indices.values():
                    index.discard(uid)

            return drop
        memo = self._memo(body)
        results = {}
        for handler in self._for(self.indexers, plural, body, type):
            results[handler.id] = await asyncio.to_thread(handler.fn, **self._kwargs(body, memo, type))

        def store() -> None:
            for hid, result in results.items():
                self.indices[hid].put(uid, result)

        return store

    async def handle(self, plural: str, body: dict[str, Any], type: str | None = None) -> None:
        """The on.event handlers (after the indices hold the event)."""
        memo = self._memo(body)
        for handler in self._for(self.watchers, plural, body, type):
            kwargs = self._kwargs(body, memo, type)
            if inspect.iscoroutinefunction(handler.fn):
                await handler.fn(**kwargs)
            else:
                await asyncio.to_thread(handler.fn, **kwargs)

    async def event(self, plural: str, body: dict[str, Any], type: str | None = None) -> None:
        """The whole of one event: index, store, handlers (type None: seen by the initial listing)."""
        store = await self.index(plural, body, type)
        store()
        await self.handle(plural, body, type)

    async def tick(self, plural: str, body: dict[str, Any]) -> None:
        """Fire this object's timers once."""
        memo = self._memo(body)
        for handler in self._for(self.timers, plural, body):
            await handler.fn(**self._kwargs(body, memo, None))

    # -- plumbing -------------------------------------------------------------------------
    def _memo(self, body: dict[str, Any]) -> kopf.Memo:
        uid = body["metadata"]["uid"]
        if uid not in self.memos:
            self.memos[uid] = copy.copy(self.base)
        return self.memos[uid]

    def _for(self, handlers: list[Any], plural: str, body: dict[str, Any], type: str | None = None) -> list[Any]:
        kwargs = self._kwargs(body, self._memo(body), type)
        return [h for h in handlers if h.selector.any_name == plural and (h.when is None or h.when(**kwargs))]

    def _kwargs(self, body: dict[str, Any], memo: kopf.Memo, type: str | None) -> dict[str, Any]:
        meta = body["metadata"]
        return {
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "body": body,
            "meta": meta,
            "spec": body.get("spec", {}),
            "status": body.get("status", {}),
            "memo": memo,
            "event": {"type": type, "object": body},
            "type": type,
            "logger": None,
            **self.indices,
        }
