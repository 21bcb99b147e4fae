"""What the template tests' children run (catsdogs.runtime.template's `entry`): small stand-ins
for a worker's main, importable in the child through PYTHONPATH."""

from __future__ import annotations

import os
import sys


def echo() -> int:
    """Answer each line of stdin on stdout, upper-cased, with the environment's ECHO_SUFFIX;
    a line "exit N" ends it with status N."""
    for line in sys.stdin:
        word = line.strip()
        if word.startswith("exit "):
            return int(word.split()[1])
        print(word.upper() + os.environ.get("ECHO_SUFFIX", ""), flush=True)
    return 0


def resident() -> int:
    """Say this process's resident file pages (KiB) and session, then wait for stdin's end."""
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print(int(status["RssFile"].split()[0]), os.getsid(0) == os.getpid(), flush=True)
    sys.stdin.read()
    return 0


def ends() -> object:
    """End as the first line of stdin says: "none" returns None, "say WORDS" exits with WORDS."""
    word = sys.stdin.readline().strip()
    if word.startswith("say "):
        sys.exit(word[4:])
    return None
