"""What a ``-compile`` rung needs at run time, proved by building with it: a C compiler and
Python's headers (Triton builds its GPU launcher, ``driver.c``, which includes ``Python.h``, on
first use) and a C++ compiler with OpenMP (inductor's CPU kernels). Torch-free, so it runs
anywhere the rungs run: ``doctor --compute``'s probe job (inside the site's image),
``make image-check`` and by hand::

    python -m scaleladder.campaign.toolchain     # one line; exit 1 naming what is missing

A compiler on PATH is not enough (a missing ``libc6-dev`` or ``Python.h`` fails only at the
first compile), so the check builds a five-line extension module with each compiler, against
this Python's include folder, and imports it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

#: a module with one function; NAME is replaced (the init function's name must match the file's)
SOURCE = """#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&module); }
"""


def c_compiler(env: dict[str, str] | None = None) -> str | None:
    """The C compiler Triton's launcher build picks: $CC, else gcc, else clang."""
    env = dict(os.environ) if env is None else env
    path = env.get("PATH")
    if env.get("CC"):
        return shutil.which(env["CC"], path=path)
    return shutil.which("gcc", path=path) or shutil.which("clang", path=path)


def cxx_compiler(env: dict[str, str] | None = None) -> str | None:
    """The C++ compiler inductor's CPU code generation picks: $CXX, else g++."""
    env = dict(os.environ) if env is None else env
    return shutil.which(env.get("CXX") or "g++", path=env.get("PATH"))


def python_include() -> str:
    """This Python's header folder, as Triton finds it.
    TRAP: Debian's python defaults to its own 'posix_local' scheme, whose include folder is
    /usr/local/include/python3.X, where no header lives; Triton asks 'posix_prefix' instead."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def _build(compiler: str, lang: str, include: str, folder: Path) -> str:
    """Compile SOURCE as ``lang`` into an extension module and import it: "ok", else the cause."""
    name = f"scaleladder_{'cxx' if lang == 'c++' else 'c'}_probe"
    src = folder / f"{name}.{'cpp' if lang == 'c++' else 'c'}"
    text = SOURCE.replace("NAME", name)
    # inductor compiles with -fopenmp: a C++ compiler without OpenMP (omp.h, libgomp) fails it too
    extra = ["-fopenmp"] if lang == "c++" else []
    src.write_text(("#include <omp.h>\n" if extra else "") + text)
    out = folder / f"{name}.so"
    try:
        run = subprocess.run([compiler, "-shared", "-fPIC", "-O0", *extra, f"-I{include}", str(src), "-o", str(out)],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{compiler} did not run: {e}"
    if run.returncode != 0:
        lines = [ln for ln in run.stderr.splitlines() if "error" in ln.lower()] or run.stderr.splitlines() or ["no output"]
        return f"{compiler} failed: {lines[0].strip()}"
    try:
        spec = importlib.util.spec_from_file_location(name, out, loader=importlib.machinery.ExtensionFileLoader(name, str(out)))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        got = module.answer()
    except Exception as e:  # an ImportError, or an unusable module
        return f"built with {compiler}, but the import failed: {type(e).__name__}: {e}"
    return "ok" if got == 42 else f"built with {compiler}, but it returned {got!r}"


def probe(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What this machine (or image) has, and whether a C and a C++ extension build and import."""
    include = python_include()
    header = os.path.join(include, "Python.h")
    cc, cxx = c_compiler(env), cxx_compiler(env)
    report: dict[str, Any] = {"cc": cc, "cxx": cxx, "python_include": include,
                              "python_h": os.path.isfile(header), "python": sys.executable}
    with tempfile.TemporaryDirectory(prefix="scaleladder-toolchain-") as tmp:
        for key, compiler, lang in (("c_extension", cc, "c"), ("cxx_extension", cxx, "c++")):
            report[key] = _build(compiler, lang, include, Path(tmp)) if compiler and report["python_h"] else "not tried"
    return report


def missing(report: dict[str, Any]) -> list[str]:
    """What a ``-compile`` rung would lack, one phrase each (empty: nothing)."""
    out = []
    if not report.get("cc"):
        out.append("no C compiler (Triton builds its launcher with $CC, gcc or clang): install gcc and libc6-dev")
    if not report.get("cxx"):
        out.append("no C++ compiler (inductor uses $CXX or g++): install g++")
    if not report.get("python_h"):
        out.append(f"no Python.h in {report.get('python_include')} (Triton's launcher includes it): "
                   "install the python3-dev matching this Python")
    for key, lang in (("c_extension", "C"), ("cxx_extension", "C++")):
        if report.get(key) not in ("ok", "not tried"):
            out.append(f"a {lang} extension does not build: {report.get(key)}")
    return out


def summary(report: dict[str, Any]) -> str:
    """One line: what was found, or what is missing."""
    lacking = missing(report)
    if lacking:
        return "toolchain: " + "; ".join(lacking)
    return (f"toolchain: cc {report['cc']}, c++ {report['cxx']}, Python.h in {report['python_include']}; "
            "a C and a C++ (OpenMP) extension built and imported")


def main() -> int:
    report = probe()
    print(summary(report))
    return 1 if missing(report) else 0


if __name__ == "__main__":
    sys.exit(main())
