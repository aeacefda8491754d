"""Run a test's server so that it cannot outlive the test process, even one killed with SIGKILL.

    python tests/service_guard.py COMMAND...

conftest.start_service starts this in a new process group. It asks Linux to send it SIGTERM when
its parent (the test process) dies, and runs COMMAND as its child in the same group. On SIGTERM,
from stop_service or from that death, it passes the signal on and gives COMMAND a few seconds to
stop as it would under a service manager (`pipeline server --auth` removes its private folder
then), then kills the whole group: MLflow's servers leave uvicorn workers behind when only the
server process is stopped.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
GRACE_S = 10


def main() -> int:
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    asked: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: asked.append(time.monotonic()))
    if os.getppid() != parent:  # the test process died before the request took effect
        os.killpg(0, signal.SIGKILL)
    command = subprocess.Popen(sys.argv[1:])
    forwarded = False
    code = 1  # replaced by the command's own, unless the grace ran out
    while True:
        try:
            code = command.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            pass
        if asked and not forwarded:
            command.send_signal(signal.SIGTERM)  # the group's SIGTERM from stop_service reached it already
            forwarded = True
        if asked and time.monotonic() - asked[0] > GRACE_S:
            break
    if asked:
        os.killpg(0, signal.SIGKILL)  # the workers that outlive the command
    return code


if __name__ == "__main__":
    sys.exit(main())
