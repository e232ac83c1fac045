"""What runs here, as a readable table: ``kcourse.backends()`` prints it, ``python -m kcourse info``
shows it with the devices and versions."""
from __future__ import annotations

import importlib.metadata
import platform

import torch


class BackendTable(dict):
    """``{name: BackendInfo}``, as ``kcourse.backends()`` has always returned, printed as a table:
    each backend, whether it runs here, and if not why and how to fix it."""

    def __str__(self) -> str:
        rows = [(info.name, "yes" if info.available else "no",
                 "" if info.available else f"{info.reason}; fix: {info.fix}") for info in self.values()]
        return table(("backend", "available", "why not / how to fix"), rows)

    __repr__ = __str__

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython
        printer.text(str(self))


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions() -> list[tuple[str, str]]:
    from . import __version__
    return [("kcourse", __version__), ("python", platform.python_version()), ("torch", torch.__version__),
            ("CUDA (torch built with)", torch.version.cuda or "none (CPU build)"),
            ("triton", _version("triton")), ("nvidia-cutlass-dsl", _version("nvidia-cutlass-dsl"))]


def devices() -> list[tuple[str, str]]:
    rows = [("cpu", f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            rows.append((f"cuda:{i}", f"{p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB"))
    else:
        rows.append(("cuda", "none visible to torch"))
    return rows


def report() -> str:
    """``python -m kcourse info``: backends, devices and versions."""
    from .backend import backends, get_backend
    return "\n\n".join([
        str(backends()),
        f"default backend here: {get_backend()} (the call's backend= > use_backend() > $KCOURSE_BACKEND > pytorch)",
        table(("device", "what"), devices()),
        table(("package", "version"), versions()),
    ])
