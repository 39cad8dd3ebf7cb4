"""The host's networking tools: ``ip`` and ``tc``, run with clear errors and no half-runs; and
entering a host's namespaces from a process that is already running."""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence

#: Signals that stop a run cleanly (ranks ended, the emulated cluster removed): a Ctrl-C,
#: a kill, and a hang-up (the terminal closed, the ssh session dropped).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ClusterError(RuntimeError):
    """The emulated cluster cannot be built, used or removed; the message says what to do."""


class DistributedError(RuntimeError):
    """A rank failed, died or timed out; the message carries a failed rank's traceback."""


class DistributedTimeoutError(DistributedError):
    """The ranks did not finish within the run's ``timeout``."""


#: Where ``ip netns`` keeps a handle on each namespace, and the files it shows the
#: namespace's processes in place of those of /etc.
NETNS_RUN = "/var/run/netns"
NETNS_ETC = "/etc/netns"
_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000
_MS_BIND, _MS_REC, _MS_SLAVE = 0x1000, 0x4000, 0x80000


def check_not_importing_script(what: str) -> None:
    """Raise where a process started by multiprocessing (a rank of a job) is importing the
    script that started it: a cluster built or run then is that script's top level running
    again on every host."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ClusterError(
            f"{what} while a host imports the script that called it: the script's top level "
            "runs again on every host (as under multiprocessing); put it under "
            '`if __name__ == "__main__":`'
        )


def check_can_build() -> None:
    """Root and iproute2 are needed to create namespaces, links and qdiscs; and not from a
    host importing the caller's script."""
    check_not_importing_script("a cluster is being built")
    if os.geteuid() != 0:
        raise ClusterError(
            "the emulated cluster needs root to create network namespaces: run as root "
            "(for example with sudo)"
        )
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(
            f"{' and '.join(missing)} not found: install iproute2 (apt install iproute2)"
        )


@contextlib.contextmanager
def deferred_signals() -> Iterator[list[int]]:
    """Inside, the :data:`STOP_SIGNALS` are only noted in the list yielded (a hang-up only
    where it is not ignored, as under ``nohup``); on leaving, any noted one raises
    KeyboardInterrupt.

    The code inside checks the list where stopping is safe, so that a Ctrl-C cannot cut a
    cleanup, a fork or a lock in half. The handlers are installed even where the signals were
    ignored at startup (a background job of a script, some CI runners), where Python would
    otherwise never raise KeyboardInterrupt. Only the main thread can catch signals: elsewhere
    this does nothing.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    # a hang-up ignored (nohup) stays ignored: the run is meant to outlive its terminal
    stopping = [s for s in STOP_SIGNALS
                if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN]  # fmt: skip
    previous = {
        signum: signal.signal(signum, lambda s, _: received.append(s)) for signum in stopping
    }
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        raise KeyboardInterrupt(signal.Signals(received[0]).name)


def run(*command: str) -> str:
    """Run a command; its stdout, or a ClusterError quoting the command and its stderr.

    The command runs in a session of its own: a terminal's Ctrl-C, which goes to the whole
    foreground process group, must not kill an ``ip netns del`` half way through a cleanup.
    """
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, check=False, start_new_session=True
        )
    except FileNotFoundError:
        raise ClusterError(f"{command[0]} not found: install iproute2") from None
    if done.returncode != 0:
        raise ClusterError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout


def ip(*arguments: str) -> str:
    return run("ip", *arguments)


def ip_json(*arguments: str) -> list:
    text = ip("-j", *arguments)
    return json.loads(text) if text.strip() else []


def tc(*arguments: str) -> str:
    return run("tc", *arguments)


def in_namespace(namespace: str, *command: str) -> str:
    return ip("netns", "exec", namespace, *command)


def namespaces() -> list[str]:
    return [entry["name"] for entry in ip_json("netns", "list")]


def link_exists(name: str) -> bool:
    return any(entry.get("ifname") == name for entry in ip_json("link", "show"))


def disable_ipv6(interface: str) -> None:
    """Keep an interface of ours from sending IPv6 router solicitations and such."""
    path = f"/proc/sys/net/ipv6/conf/{interface}/disable_ipv6"
    if os.path.exists(path):
        with open(path, "w") as switch:
            switch.write("1")


def enter_namespace(namespace: str) -> None:
    """Move this process into the network namespace ``namespace`` as ``ip netns exec``
    does, but for ``/sys`` (which it leaves the machine's; nothing of ours reads it in a
    rank): that namespace, a mount namespace of its own whose mounts do not reach the
    machine's, and each file of ``/etc/netns/NAMESPACE/`` bound over its namesake in
    ``/etc`` (the hosts file: :mod:`commpress.cluster.emulated`). Only a process with one
    thread may: a thread keeps the namespace it was started in."""
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise ClusterError(
            f"entering network namespace {namespace!r} from a process of {threads} threads: "
            "the others would stay outside (a module imported at the top level of the "
            "job's script may have started one)"
        )
    libc = _libc()
    try:
        handle = os.open(os.path.join(NETNS_RUN, namespace), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ClusterError(f"no network namespace {namespace!r}: is its cluster up?") from None
    try:
        _succeeded(libc.setns(handle, _CLONE_NEWNET), f"entering network namespace {namespace!r}")
    finally:
        os.close(handle)
    _succeeded(libc.unshare(_CLONE_NEWNS), "a mount namespace of its own")
    _succeeded(libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None), "mounts kept apart")
    etc = os.path.join(NETNS_ETC, namespace)
    for name in sorted(os.listdir(etc)) if os.path.isdir(etc) else []:
        source, target = os.path.join(etc, name), os.path.join("/etc", name)
        if os.path.exists(target):
            bound = libc.mount(source.encode(), target.encode(), None, _MS_BIND, None)
            _succeeded(bound, f"{source} bound over {target}")


def end_with(pid: int, poll_seconds: float = 0.5) -> None:
    """Kill this process as soon as process ``pid`` has ended. A thread waits on its pidfd
    (Linux 5.3 and later); where there is none (older kernels, such as RHEL 8's 4.18), it
    looks every ``poll_seconds`` instead."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGKILL)
    except (OSError, AttributeError):
        handle = None

    def wait_for_its_end() -> None:
        if handle is None:
            while running(pid):
                time.sleep(poll_seconds)
        else:
            ended = select.poll()
            ended.register(handle, select.POLLIN)
            ended.poll()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait_for_its_end, name="commpress-end-with", daemon=True).start()


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has), as far as this
    process can see: where ``/proc`` does not show it (mounted with ``hidepid``), whether
    it exists."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def kill_marked(marker: str, namespaces: Sequence[str], rounds: int = 20) -> int:
    """SIGKILL every process inside one of the network namespaces ``namespaces`` whose
    environment holds ``marker`` (``NAME=VALUE``), scanning again until a scan finds none
    (at most ``rounds`` scans, so that one forking as fast as it is killed cannot hold us);
    how many were killed. A process that replaced its environment (``env -i``) or left
    those namespaces is not found."""
    entry = marker.encode()
    inside = {_namespace_id(NETNS_RUN, namespace) for namespace in namespaces} - {None}
    killed = 0
    for _ in range(rounds):
        found = sum(
            _kill_if_marked(pid, entry)
            for pid in _process_ids()
            if pid != os.getpid() and _namespace_id(f"/proc/{pid}/ns", "net") in inside
        )
        killed += found
        if not found:
            break
        time.sleep(0.05)  # let the killed ones die before looking again
    return killed


def _process_ids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _namespace_id(folder: str, name: str) -> tuple[int, int] | None:
    """The identity of the namespace a handle in ``folder`` names, None if it is gone."""
    try:
        handle = os.stat(os.path.join(folder, name))
    except OSError:
        return None
    return handle.st_dev, handle.st_ino


def _kill_if_marked(pid: int, entry: bytes) -> bool:
    """Kill process ``pid`` if its environment holds ``entry``; whether it did. The signal
    goes through a pidfd where there is one, so that it reaches the process whose
    environment was read, never another that took its number since."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):
        handle = None
    try:
        with open(f"/proc/{pid}/environ", "rb") as environment:
            if entry not in environment.read().split(b"\0"):
                return False
        if handle is None:
            os.kill(pid, signal.SIGKILL)
        else:
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        return True
    except (ProcessLookupError, FileNotFoundError, PermissionError):
        return False
    finally:
        if handle is not None:
            os.close(handle)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _succeeded(result: int, what: str) -> None:
    if result != 0:
        raise ClusterError(f"{what} failed: {os.strerror(ctypes.get_errno())}")
