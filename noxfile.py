"""Sessions for tests, lint, type checks, docs and benchmarks.

Every install is constrained by ``constraints.txt`` (which pins the CPU build of torch).
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "tests_faiss", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = False

CONSTRAINTS = ("-c", "constraints.txt")
TEST_DEPS = (
    "pytest",
    "pytest-xdist",
    "pytest-timeout",
    "hypothesis",
    "scikit-learn",
    "scipy",
    "numpy",
    "tensorboard",
    "matplotlib",
)
# The `lightning` extra, for tests/integrations (a real Trainer) in the core's session only:
# the faiss session runs no Lightning test. The constraints keep torch pinned.
LIGHTNING_DEPS = ("lightning",)
# Two pytest workers: the slow tests (installs into fresh venvs, subprocesses) wait on
# disk and network as much as on the CPU, so two finish sooner even on two cores.
PYTEST = ("python", "-m", "pytest", "-n", "2")
# Tiny third-party distributions that exercise the plugin registry.
TEST_PLUGINS = (
    "tests/plugins/toy_knn",
    "tests/plugins/broken_knn",
    "tests/plugins/dup_one",
    "tests/plugins/dup_two",
    "tests/plugins/core_name_thief",
)


@nox.session
def tests(session: nox.Session) -> None:
    """The core's tests with faiss absent."""
    session.install(*CONSTRAINTS, "-e", ".", *TEST_DEPS, *LIGHTNING_DEPS, *TEST_PLUGINS)
    session.run(*PYTEST, "tests", "-m", "not faiss", *session.posargs)


@nox.session
def tests_faiss(session: nox.Session) -> None:
    """The faiss plugin's tests and the core's tests that need faiss.

    The plugin is installed from its local path: the core's ``faiss`` extra would resolve
    ``pytorch-metric-learning-faiss`` by name from a package index instead.
    """
    session.install(*CONSTRAINTS, "-e", ".", "-e", "plugins/faiss", *TEST_DEPS)
    session.run(*PYTEST, "tests", "plugins/faiss/tests", "-m", "faiss", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy on the public packages."""
    session.install(*CONSTRAINTS, "-e", ".", "mypy", "numpy")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site; any mkdocs warning (a broken link, say) fails it."""
    session.install("mkdocs>=1.6,<2")
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", *session.posargs)


@nox.session
def benchmarks(session: nox.Session) -> None:
    """Speed and memory against the baselines users would pick instead."""
    session.install(*CONSTRAINTS, "-e", ".", "-e", "plugins/faiss", "scikit-learn")
    for script in session.posargs or ["knn"]:
        session.run("python", f"benchmarks/{script}.py")


PML29 = "pytorch-metric-learning==2.9.0"


@nox.session
def bench_pml29(session: nox.Session) -> None:
    """benchmarks/accuracy.py: our AccuracyCalculator against pytorch-metric-learning 2.9.0.

    2.9.0 has this project's import name, so it lives alone in this session's virtualenv
    (with faiss-cpu and scikit-learn, which its defaults use). This project goes into a
    second virtualenv beside it, and the benchmark runs 2.9.0 as a subprocess with this
    session's python. ``nox -R -s bench_pml29 -- --sizes 10000`` reuses both.
    """
    _run_beside_pml29(session, "benchmarks/accuracy.py")


@nox.session
def bench_contention(session: nox.Session) -> None:
    """benchmarks/contention.py: our AccuracyCalculator (default threads and one thread)
    against 2.9.0, idle and beside a busy neighbour process, in one run.

    The environments are those of ``bench_pml29``. ``nox -R -s bench_contention --
    --quick`` reuses both and measures one small cell.
    """
    _run_beside_pml29(session, "benchmarks/contention.py")


@nox.session
def compat_pml29(session: nox.Session) -> None:
    """tests/compat/pml29_compare.py: the 2.x helpers here and in 2.9.0 give equal outputs.

    As in ``bench_pml29``, 2.9.0 lives alone in this session's virtualenv (with faiss-cpu
    and scikit-learn, which its imports need) and this project in a second one beside it.
    Not one of the default sessions. ``nox -R -s compat_pml29 -- --cases 200 --seed 3``
    reuses both.
    """
    _run_beside_pml29(session, "tests/compat/pml29_compare.py")


def _run_beside_pml29(session: nox.Session, script: str) -> None:
    """Run ``script`` with this project's python (see ``_pml29_beside_ours``), given
    2.9.0's python as ``--pml29-python``, and the session's arguments."""
    ours_python = _pml29_beside_ours(session)
    pml29_python = str(Path(session.bin) / "python")
    session.run(
        ours_python, script, "--pml29-python", pml29_python, *session.posargs, external=True
    )


OML = "open-metric-learning==4.0.0"
# What OML's metric code (oml.functional) imports; its other dependencies serve its
# datasets, models and pipelines, and its torchvision would pull a CUDA build of torch.
OML_METRIC_DEPS = ("numpy", "tqdm", "matplotlib", "omegaconf")


@nox.session
def bench_oml(session: nox.Session) -> None:
    """benchmarks/oml.py: recall_at_K against Open Metric Learning's cmc@K, time and memory.

    OML (import name ``oml``) goes into this session's virtualenv with ``--no-deps``, next
    to this project and only what OML's metric code needs; 2.9.0 goes into a second
    virtualenv beside it, for bench_pml29's ratios on the same data. Not one of the default
    sessions. ``nox -R -s bench_oml -- --sizes 20000`` reuses both.
    """
    session.install(*CONSTRAINTS, "-e", ".", *OML_METRIC_DEPS)
    session.install(*CONSTRAINTS, "--no-deps", OML)
    pml29 = Path(session.virtualenv.location).parent / f"{session.name}_pml29"
    pml29_python = str(pml29 / "bin" / "python")
    session.run_install("python", "-m", "venv", "--clear", str(pml29))
    session.run_install(
        pml29_python,
        "-m",
        "pip",
        "install",
        "-q",
        *CONSTRAINTS,
        PML29,
        "faiss-cpu",
        "scikit-learn",
        external=True,
    )
    session.run("python", "benchmarks/oml.py", "--pml29-python", pml29_python, *session.posargs)


def _pml29_beside_ours(session: nox.Session) -> str:
    """Install 2.9.0 in the session's virtualenv and this project in a second one beside
    it (they share an import name); return the second one's python."""
    session.install(*CONSTRAINTS, PML29, "faiss-cpu", "scikit-learn")
    ours = Path(session.virtualenv.location).parent / f"{session.name}_ours"
    ours_python = str(ours / "bin" / "python")
    session.run_install("python", "-m", "venv", "--clear", str(ours))
    session.run_install(
        ours_python, "-m", "pip", "install", "-q", *CONSTRAINTS, "-e", ".", external=True
    )
    return ours_python
