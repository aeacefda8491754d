"""Run a test's server so that it cannot outlive the test process, even one killed with SIGKILL.

    python tests/service_guard.py COMMAND...

conftest.start_service starts this in a new process group. It asks Linux to send it SIGTERM when
its parent (the test process) dies, runs COMMAND as its child in the same group, and on SIGTERM,
from stop_service or from that death, kills the whole group: MLflow's servers leave uvicorn
workers behind when only the server process is stopped.
"""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def main() -> int:
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    if os.getppid() != parent:  # the test process died before the request took effect
        os.killpg(0, signal.SIGKILL)
    return subprocess.call(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
