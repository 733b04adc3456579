"""The served engine in its own process: the python stub keeps Triton's side (parsing, responses,
cancellation checks), a worker process owns the engine and runs its loop on its main thread.

Why: in the stub the engine ran in a background thread, where every parallel region of torch's
CPU kernels costs ~0.2 ms more (``pick_thread_count``), so the served engine ran at 0.60-0.63 of
the same engine in-process. In a process of its own the loop is on the main thread again. The
weights load once, in the worker; the stub loads none.

Wire: one Unix socketpair, :class:`multiprocessing.connection.Connection` frames (length-prefixed
pickles). Per engine step the worker sends one small frame per request that produced tokens
(ids, counters): tens of µs against a step of milliseconds; with ``coalesce`` (interval, streaming)
one per ``interval`` steps (:mod:`trtspec.triton.backend.coalesce`, serving.stream_interval).

    stub → worker   ("submit", rid, prompt, params, draft_tokens, coalesce)   ("cancel", rid)   ("shutdown",)
    worker → stub   ("ready", info) | ("failed", message)            once, after the engine is built
                    ("submitted", rid, None | (kind, message, fix))  the answer to each submit
                    ("event", rid, WireEvent)                        each step's output per request

Death either way is seen at once: the stub's reader gets EOF when the worker dies (every request
in flight gets an error, then the stub exits so the watchdog reloads the model, as for a dead
stub); the worker's reader gets EOF when the stub dies and the worker exits.

    python -m trtspec.triton.backend.worker FD     (started by :class:`WorkerEngine`, not by hand)
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import stat
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable

from trtspec.errors import TrtspecError, one_line
from trtspec.speculative.kernels import wo_cpu_status
from trtspec.triton.backend.coalesce import coalesced
from trtspec.triton.backend.common import resident_bytes

PYTHON_ENV = "TRTSPEC_WORKER_PYTHON"  # the interpreter to start workers with (set by trtspec's launcher)
START_TIMEOUT_S = 600.0


@dataclass
class WireEvent:
    """What the stub's response code reads of an engine ``Event`` (the request object stays home)."""

    new_tokens: list[int]
    finished: bool
    finish_reason: str | None
    stats: Any  # RequestStats
    new_logprobs: list[float] | None = None
    rss: int | None = None  # the worker's resident memory, on finished events
    policy: dict | None = None  # on finished events: the goodput policy's view (Engine.policy_view)


class WorkerError(TrtspecError):
    """The engine worker could not start, or died."""


def worker_python() -> str:
    """The interpreter for the worker: ``$TRTSPEC_WORKER_PYTHON`` (trtspec's launcher sets it to its
    own), else this process's if it is a Python (inside Triton's stub it is the stub binary), else
    ``python3`` on PATH (NVIDIA's containers)."""
    env = os.environ.get(PYTHON_ENV)
    if env:
        return env
    exe = sys.executable or ""
    if os.path.basename(exe).startswith("python"):
        return exe
    found = shutil.which("python3")
    if not found:
        raise WorkerError("cannot start the engine worker: no python3 on PATH",
                          fix=f"set {PYTHON_ENV} to the Python that has trtspec installed")
    return found


class WorkerEngine:
    """A :class:`~trtspec.speculative.engine.BackgroundEngine` look-alike whose engine runs in a
    worker process: ``submit(prompt, params, callback, draft_tokens)``, ``shutdown()``; callbacks
    run on this object's reader thread, one request's in order; a callback returning False
    cancels its request (the worker stops it at its next step)."""

    def __init__(self, spec_json: str, *, max_queue: int = 1024, on_death: Callable[[str], None] | None = None,
                 start_timeout: float = START_TIMEOUT_S, env: dict | None = None):
        self.on_death = on_death
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen([worker_python(), "-m", "trtspec.triton.backend.worker", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self.conn = Connection(ours.detach())
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable] = {}
        self._cancelled: set[int] = set()
        self._answers: dict[int, tuple[threading.Event, list]] = {}
        self._ids = itertools.count(1)
        self._closing = False
        self._send(("init", spec_json, max_queue))
        if not self.conn.poll(start_timeout):
            self.proc.kill()
            raise WorkerError(f"the engine worker did not start within {start_timeout:.0f} s")
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            rc = self.proc.wait()
            raise WorkerError(f"the engine worker exited while starting (exit code {rc})",
                              fix="see the server log: the worker's traceback is above this line") from None
        if msg[0] != "ready":
            self.proc.wait()
            raise WorkerError(f"the engine worker failed to build the engine: {msg[1]}")
        self.info: dict = msg[1]
        self.threads = self.info.get("threads")
        self.warm_up_error = self.info.get("warm_up_error")
        self._reader = threading.Thread(target=self._read, name="trtspec-worker-reader", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------------ BackgroundEngine's API

    def submit(self, prompt: list[int], params, callback: Callable, draft_tokens: list[int] | None = None,
               coalesce: tuple[int, bool] | None = None) -> int:
        """``coalesce``: (stream_interval, streaming): the worker hands on one event per interval
        steps (trtspec.triton.backend.coalesce), so fewer frames cross and fewer responses leave."""
        rid = next(self._ids)
        done, answer = threading.Event(), []
        with self._lock:
            self._callbacks[rid] = callback
            self._answers[rid] = (done, answer)
        self._send(("submit", rid, list(prompt), params, draft_tokens, coalesce))
        if not done.wait(60) or not answer:
            with self._lock:
                self._callbacks.pop(rid, None)
                self._answers.pop(rid, None)
            raise WorkerError("the engine worker did not answer a submit within 60 s")
        error = answer[0]
        if error is not None:
            from trtspec.speculative.engine import RequestError  # lazy: the exception type the engine raises

            kind, message, fix = error
            raise (RequestError if kind == "RequestError" else TrtspecError)(message, fix=fix)
        return rid

    def shutdown(self, timeout: float = 10) -> None:
        self._closing = True
        try:
            self._send(("shutdown",))
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout)

    # ------------------------------------------------------------------ internals

    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # noqa: BLE001 - an undecodable frame: the wire is broken, stop the worker
                traceback.print_exc()
                self.proc.kill()
                break
            if msg[0] == "event":
                self._deliver(msg[1], msg[2])
            elif msg[0] == "submitted":
                with self._lock:
                    pending = self._answers.pop(msg[1], None)
                if pending is not None:
                    pending[1].append(msg[2])
                    pending[0].set()
        self._worker_gone()

    def _deliver(self, rid: int, ev: WireEvent) -> None:
        with self._lock:
            cb = self._callbacks.get(rid)
        if cb is None:
            return
        try:
            keep = cb(ev) is not False
        except Exception:  # noqa: BLE001 - a broken callback must not stop the reader
            keep = False
        if ev.finished:
            with self._lock:
                self._callbacks.pop(rid, None)
                self._cancelled.discard(rid)
        elif not keep:
            with self._lock:
                first = rid not in self._cancelled
                self._cancelled.add(rid)
            if first:
                try:
                    self._send(("cancel", rid))
                except OSError:
                    pass

    def _worker_gone(self) -> None:
        rc = self.proc.wait()
        with self._lock:
            callbacks, self._callbacks = self._callbacks, {}
            answers, self._answers = self._answers, {}
        for done, answer in answers.values():
            answer.append(("WorkerError", f"the engine worker exited (code {rc})", None))
            done.set()
        if self._closing:
            return
        why = f"the engine worker process exited (code {rc})"
        from trtspec.speculative.stats import RequestStats  # lazy: only when the worker died

        for cb in callbacks.values():
            try:
                cb(WireEvent([], True, f"error: {why}", RequestStats()))
            except Exception:  # noqa: BLE001
                pass
        if self.on_death is not None:
            self.on_death(why)


# ---------------------------------------------------------------------------------------------
# the worker process


LOAD_LOCK = "engine-load.lock"  # in this user's state folder (trtspec.triton.launch.state)


@contextlib.contextmanager
def one_load_at_a_time():
    """Engine workers build their engines one after another on a machine. Loading a ModelOpt
    checkpoint peaks at several times the loaded model (the Qwen 1.5B INT4 target: 8.4 GiB of
    anonymous memory for 2.9 GiB loaded), and tritonserver starts every model at once: with two
    targets and a draft loading together the OOM killer took one on a 24 GiB machine. The lock
    (``flock``) goes with the process, so a worker killed while loading frees it.

    The lock is per user: a file in this user's private state folder (``$XDG_RUNTIME_DIR/trtspec``
    or ``<tmp>/trtspec-<uid>``, 0700), opened with ``O_NOFOLLOW``. A machine-wide file in /tmp let
    the first user's 0600 file (or a planted symlink) stop every other user's engines from loading.
    When that folder cannot be used the engine loads without waiting (the lock only spreads memory
    peaks; it guards nothing), with a warning."""
    from trtspec.triton.access import state_dir  # lazy: only a worker that loads an engine needs it

    fd = None
    try:
        d = state_dir()
        fd = os.open(os.path.join(d, LOAD_LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise OSError(f"{os.path.join(d, LOAD_LOCK)} is not a regular file of yours")
    except Exception as e:  # noqa: BLE001 - ServerError (an unsafe folder) or OSError
        if fd is not None:
            os.close(fd)
            fd = None
        print(f"trtspec: warning: loading without the one-load-at-a-time lock: {e}", file=sys.stderr, flush=True)
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


STEP_TRACE_ENV = "TRTSPEC_STEP_TRACE"  # a path prefix: each engine worker appends to <prefix>.<method>.<pid>.jsonl


def step_trace_writer(prefix: str, method: str) -> Callable[[dict], None]:
    """The engine's ``trace`` callback for ``TRTSPEC_STEP_TRACE``: appends one JSON line per event
    to ``<prefix>.<method>.<pid>.jsonl`` (line-buffered, so a killed worker keeps what it wrote)."""
    path = f"{prefix}.{method}.{os.getpid()}.jsonl"
    try:
        f = open(path, "a", buffering=1)
    except OSError as e:  # the first line is what the stub reports: it names the variable and the fix
        raise TrtspecError(f"{STEP_TRACE_ENV}={prefix}: cannot write {path} ({e.strerror}); give a prefix in a "
                           f"writable folder, or unset {STEP_TRACE_ENV}") from e

    def write(event: dict) -> None:
        f.write(json.dumps(event) + "\n")
    return write


def serve(conn: Connection) -> int:
    """Build the engine from the first frame's RuntimeSpec, then run it until told to stop (or the
    stub is gone)."""
    from trtspec.speculative.engine import BackgroundEngine, pick_thread_count  # lazy: torch, in the worker only (the stub side needs none)
    from trtspec.speculative.runtime import build_engine  # lazy: as above
    from trtspec.speculative.spec import RuntimeSpec  # lazy: as above

    kind, spec_json, max_queue = conn.recv()
    try:
        spec = RuntimeSpec.from_json(spec_json)
        with one_load_at_a_time():
            engine = build_engine(spec)
            # the thread count is timed here too, while no other worker loads (the loads are what
            # disturbed the reading: see pick_thread_count)
            try:
                threads = pick_thread_count(engine)
            except Exception:  # noqa: BLE001 - keep the configured count, as BackgroundEngine.run does
                threads = None
        trace_to = os.environ.get(STEP_TRACE_ENV)
        if trace_to:  # diagnosis: one JSON line per prefill and per step, a file per worker
            engine.trace = step_trace_writer(trace_to, spec.method)
        background = BackgroundEngine(engine, max_queue=max_queue, pick_threads=False, start=False)
        background.threads = threads
    except Exception as e:  # noqa: BLE001 - reported to the stub, which fails its initialize
        conn.send(("failed", f"{type(e).__name__}: {one_line(e)}"))
        return 1
    send_lock = threading.Lock()
    cancelled: set[int] = set()

    def send(msg: tuple) -> None:
        with send_lock:
            conn.send(msg)

    def callback_for(rid: int, coalesce: tuple[int, bool] | None):
        def send_event(ev) -> None:
            send(("event", rid, WireEvent(ev.new_tokens, ev.finished, ev.finish_reason, ev.stats, ev.new_logprobs,
                                          resident_bytes() if ev.finished else None,
                                          background.engine.policy_view() if ev.finished else None)))

        hand_on = send_event if coalesce is None else coalesced(send_event, *coalesce)

        def on_event(ev) -> bool | None:
            hand_on(ev)  # every step, or one per interval (a cancel below still stops it at once)
            if ev.finished:
                cancelled.discard(rid)
                return None
            return False if rid in cancelled else None
        return on_event

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the stub is gone: nobody to answer
            if msg[0] == "submit":
                _, rid, prompt, params, draft, coalesce = msg
                try:
                    background.submit(prompt, params, callback_for(rid, coalesce), draft_tokens=draft)
                    send(("submitted", rid, None))
                except TrtspecError as e:
                    send(("submitted", rid, (type(e).__name__, str(e).split("\n")[0], getattr(e, "fix", None))))
                except Exception as e:  # noqa: BLE001 - one bad request must not stop the worker
                    send(("submitted", rid, ("Exception", f"{type(e).__name__}: {one_line(e)}", None)))
            elif msg[0] == "cancel":
                cancelled.add(msg[1])
            elif msg[0] == "shutdown":
                background.shutdown()
                return

    def started() -> None:
        info = {"vocab_size": int(engine.target.args.vocab_size), "max_seq_len": int(engine.max_seq_len),
                "device": str(engine.device), "threads": background.threads, "cpu_kernels": wo_cpu_status(if_used=True),
                "warm_up_error": background.warm_up_error, "pid": os.getpid()}
        send(("ready", info))
        threading.Thread(target=read, name="trtspec-worker-commands", daemon=True).start()

    background.run(on_started=started)
    time.sleep(0.05)  # the last events are on the wire before the socket closes
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m trtspec.triton.backend.worker FD (started by the tensorrt_llm model)", file=sys.stderr)
        return 2
    return serve(Connection(int(argv[0])))


if __name__ == "__main__":
    # run from the module under its own name (not __main__): the WireEvent frames must unpickle
    # as trtspec.triton.backend.worker.WireEvent in the stub
    from trtspec.triton.backend.worker import main as _main  # lazy: the module under its own name, not __main__

    sys.exit(_main())
