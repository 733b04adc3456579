"""One exception tree. Every message names what is wrong, the value, and the fix.

Library code raises these; only ``trtspec.cli`` turns them into a message and an exit code.
"""

from __future__ import annotations


class TrtspecError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None):
        self.message = message
        self.fix = fix
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class ConfigError(TrtspecError):
    """A recipe value is invalid. ``field`` is the dotted path of the offending key."""

    exit_code = 2

    def __init__(self, field: str, value: object, problem: str, *, fix: str | None = None):
        self.field = field
        self.value = value
        self.problem = problem
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"{field}: {problem} (got {shown})", fix=fix)


class ConfigErrors(TrtspecError):
    """Several config errors at once (the user fixes them in one pass)."""

    exit_code = 2

    def __init__(self, errors: list[ConfigError], source: str | None = None):
        self.errors = errors
        head = f"{source}: " if source else ""
        lines = [f"{head}{len(errors)} problem(s) in the recipe:"]
        lines += [f"  - {e}".replace("\n", "\n    ") for e in errors]
        super().__init__("\n".join(lines))


class PreflightError(TrtspecError):
    """A preflight check failed before any expensive work."""


class ModelError(TrtspecError):
    """A model folder is missing, unreadable or of an unsupported architecture."""


class StageError(TrtspecError):
    """A pipeline stage (quantize, build, package, serve, validate) failed."""


class CommandError(StageError):
    """An external command failed; carries the argv and the stderr tail."""

    def __init__(self, argv: list[str], returncode: int, stderr_tail: str, *, fix: str | None = None):
        self.argv = argv
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        import shlex

        msg = f"command failed (exit {returncode}): {shlex.join(argv)}"
        if stderr_tail.strip():
            msg += "\n  stderr (last lines):\n    " + "\n    ".join(stderr_tail.strip().splitlines()[-20:])
        super().__init__(msg, fix=fix)


class ServerError(TrtspecError):
    """tritonserver failed to start, load a model, or stay healthy."""


class ClientError(TrtspecError):
    """A request to the server failed (unreachable, unknown model, server-side error)."""


class GateFailed(TrtspecError):
    """Validation ran and a rollout gate failed: keep the baseline."""


def one_line(e: BaseException) -> str:
    """``Type: first line of the message``, for errors kept in a status field or a log line."""
    text = str(e)
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


class MissingExtra(TrtspecError):
    """A command needs an optional dependency that is not installed (its extra names it)."""

    exit_code = 2


# top-level module → the extra that installs it (pyproject.toml [project.optional-dependencies])
EXTRA_OF_MODULE: dict[str, str] = {
    "torch": "torch-runtime",
    "transformers": "torch-runtime",
    "safetensors": "torch-runtime",
    "tokenizers": "client",
    "accelerate": "torch-runtime",
    "modelopt": "quantize",
    "tritonclient": "client",
    "grpc": "client",
    "numpy": "client",
    "matplotlib": "client",
    "gguf": "gguf",
    "pytriton": "cpu-triton",
}


def missing_extra(e: ModuleNotFoundError, extra: str | None, what: str) -> MissingExtra | None:
    """The error to show when ``what`` (a command) failed to import ``e.name``; None when the
    missing module is not an optional dependency of trtspec (a real bug: let it raise)."""
    top = (e.name or "").split(".")[0]
    known = EXTRA_OF_MODULE.get(top)
    if known is None:
        return None
    # a command's own extra covers its whole set (e.g. [serve] brings torch-runtime's modules)
    need = extra if extra not in (None, "all") and known != "gguf" else known
    return MissingExtra(f"{what} needs the Python package '{top}', which is not installed",
                        fix=f"pip install 'trtspec[{need}]'")


def require_extra(extra: str, modules: tuple[str, ...], what: str) -> None:
    """Raise :class:`MissingExtra` naming ``extra`` when one of ``modules`` is not installed: for
    a command whose own imports do not need them, but what it starts does (``trtspec serve``:
    the python-backend models run in tritonserver's stubs)."""
    import importlib.util

    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise MissingExtra(f"{what} needs the Python package '{name}', which is not installed",
                               fix=f"pip install 'trtspec[{extra}]'")
