"""A child for run_child tests: dies by the signal named in its request, or sleeps past its timeout."""

import os
import signal
import time

from rules.execute.child import serve


def _misbehave(request: dict) -> dict:
    if request["action"] == "signal":
        os.kill(os.getpid(), getattr(signal, request["signal"]))
    time.sleep(request["seconds"])
    return {}


if __name__ == "__main__":
    serve(_misbehave)
