"""kopf's startup gate with tidal's patch: same answers, and waiters woken only when the set's state
changes (kopf as shipped wakes every waiter on every toggle made or dropped: O(objects^2))."""

import asyncio

import structlog
from kopf._cogs.aiokits.aiotoggles import ToggleSet

from tidal.k8s import kopf_startup


def test_install_is_idempotent():
    assert kopf_startup.install() and kopf_startup.install()


def test_the_gate_opens_when_the_last_toggle_drops_and_wakes_nobody_before():
    kopf_startup.install()

    async def scenario() -> tuple[list[str], int]:
        gate = ToggleSet(all)
        listed = await gate.make_toggle(name="listing")
        objects = [await gate.make_toggle(name=str(i)) for i in range(50)]
        wakes = 0
        notify = gate._condition.notify_all

        def counting() -> None:
            nonlocal wakes
            wakes += 1
            notify()

        gate._condition.notify_all = counting  # type: ignore[method-assign]
        order: list[str] = []

        async def waiter(t) -> None:
            await gate.drop_toggle(t)
            await gate.wait_for(True)
            order.append("through")

        tasks = [asyncio.create_task(waiter(t)) for t in objects]
        for _ in range(5):
            await asyncio.sleep(0)
        assert not order, "nobody passes while the listing is not done"
        extra = await gate.make_toggle(name="late object")  # the set stays off: no wake-up
        assert wakes == 0
        await gate.drop_toggle(listed)
        await asyncio.sleep(0)
        assert not order
        await gate.drop_toggle(extra)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return order, wakes

    order, wakes = asyncio.run(scenario())
    assert order == ["through"] * 50
    assert wakes == 1, "one wake-up: when the set turned on"


def test_any_sets_still_turn_off_when_their_only_on_toggle_goes():
    kopf_startup.install()

    async def scenario() -> bool:
        paused = ToggleSet(any)
        peer = await paused.make_toggle(True, name="peer")
        waiting = asyncio.create_task(paused.wait_for(False))
        await asyncio.sleep(0)
        assert not waiting.done()
        await paused.drop_toggle(peer)
        await asyncio.wait_for(waiting, 5)
        return paused.is_on()

    assert asyncio.run(scenario()) is False


def test_the_gate_logs_each_listing_and_its_opening_once_and_a_pause_set_logs_nothing():
    """bench.operator times a warm-up's listing and indexing from these two INFO lines."""
    kopf_startup.install()

    async def scenario() -> None:
        gate = ToggleSet(all)
        blocker = await gate.make_toggle(name="orchestration blocker")
        listing = await gate.make_toggle(name="pods.v1@None")
        objects = [await gate.make_toggle(name=f"('pods', 'uid-{i}')") for i in range(3)]
        await gate.drop_toggle(blocker)
        await gate.drop_toggle(listing)
        await gate.drop_toggles(objects[:2])
        await gate.drop_toggle(objects[2])
        paused = ToggleSet(any)
        peer = await paused.make_toggle(True, name="peering")
        await paused.drop_toggle(peer)

    with structlog.testing.capture_logs() as logs:
        asyncio.run(scenario())
    assert [(e["event"], e.get("resource"), e.get("objects_not_indexed")) for e in logs] == [
        ("startup gate: listing received", "pods.v1@None", 3),
        ("startup gate open: every listed object indexed", None, None),
    ]
