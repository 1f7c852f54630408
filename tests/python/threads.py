"""Running a call on a thread of its own, for the owner-thread tests of the bindings."""

import threading
import time


def in_thread(fn, name="intruder"):
    """fn() on a new thread named `name`: {"value": its result} or {"error": what it raised}."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (the test inspects what crossed)
            box["error"] = e

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    return box


def ticks_while(call):
    """call() while another thread reads the clock as fast as it can: (its result, the readings
    taken during it, start, end). A call that holds the GIL leaves one gap as long as itself."""
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())

    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        time.sleep(0.05)
        start = time.perf_counter()
        result = call()
        end = time.perf_counter()
    finally:
        done.set()
        thread.join()
    return result, [t for t in ticks if start < t < end], start, end
