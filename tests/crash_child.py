"""A child for run_child tests: dies by the signal named in its request (or aborts as a C++ exception does),
sleeps (past its timeout), holds memory (answering when it started and ended), leaves a thread running,
answers with its pid and an environment variable (what a warm worker carries from job to job) or the libraries it
found loaded, or exits 0 without an answer."""

import os
import signal
import sys
import time

from epbuild.execute.child import serve
from epbuild.execute.forked_jobs import Handoff


def _misbehave(request: dict) -> dict:
    started = time.time()
    if request["action"] == "signal":
        os.kill(os.getpid(), getattr(signal, request["signal"]))
    if request["action"] == "allocate":
        held = bytearray(request["mb"] << 20)
        held[::4096] = b"x" * len(held[::4096])  # touch every page
    if request["action"] == "cpp_abort":  # what an EP library's uncaught C++ exception leaves, colour codes included
        sys.stderr.write("\x1b[31m[E:QnnDsp] <E> Failed to finalize graph\x1b[0m\n"
                         "terminate called after throwing an instance of 'std::runtime_error'\n"
                         "  what():  Tensor name not found.\n")
        sys.stderr.flush()
        os.abort()
    if request["action"] == "vanish":  # ends without an answer, as a worker that died flushing its log
        os._exit(0)
    if request["action"] == "thread":  # leaves a thread running, as QNN's HTP simulator leaves its HVX threads
        import threading

        threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
        return {"pid": os.getpid()}
    if request["action"] == "maps":  # which of these libraries this process had loaded when its job began
        with open("/proc/self/maps", encoding="utf-8") as maps:
            mapped = {line.split()[-1].rsplit("/", 1)[-1] for line in maps if "/" in line}
        return {"pid": os.getpid(), "loaded": sorted(set(request["names"]) & mapped)}
    if request["action"] == "metric":  # a project's `module:function` metric, imported as a validation does
        from epbuild.steps.validation.metric_code import custom_metric

        function = custom_metric({"metric": request["metric"], "metric_file": request["file"]})
        return {"pid": os.getpid(), "value": function(outputs={}, labels=None, reference={})}
    if request["action"] == "env":
        return {"pid": os.getpid(), "value": os.environ.get(request["name"])}
    time.sleep(request.get("seconds", 0))
    return {"pid": os.getpid(), "started": started, "ended": time.time()}


def main(handoff: Handoff | None = None) -> None:
    """`python -m` this module, or a fork server's child or warm worker, runs this."""
    serve(_misbehave, handoff)


if __name__ == "__main__":
    main()
