"""The notebooks on a Binder box, as far as this machine can tell: the environment built the way
repo2docker builds it, then every notebook run on one core with its peak memory measured.

    python benchmarks/bench_binder.py                 # a fresh environment, every notebook
    python benchmarks/bench_binder.py --env DIR       # reuse (or keep) the environment in DIR
    python benchmarks/bench_binder.py --only 06_multi_node --repeats 2

The build follows repo2docker's steps for a repository with a ``binder/`` folder: a fresh virtual
environment of the Python in ``binder/runtime.txt``, ``pip install -r binder/requirements.txt``, then
``binder/postBuild`` run from the repository root. It runs on a copy of the repository's files (the
ones git tracks, as they are in the working tree), with its own Jupyter directories and HOME, so
nothing of this machine's is read or written.

Each notebook then runs top to bottom in that environment (nbclient, the way a learner's Run All
does) on one core (``taskset``: the runner, its kernel and every rank it starts share CPU 0), and
the script samples, every 0.2 s, the memory of that whole process tree: the sum of each process's
proportional set size (PSS: a page shared by k processes counts 1/k to each, so forked ranks that
share torch's pages are not counted k times). Binder's limit is on that total (about 2 GB; held here
to 2 GiB); the time limit this project sets is 2 minutes a notebook. A notebook's cells run in order,
so its peak is the peak of its heaviest cell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from paralab.bench import benchmark_parser

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30
LIMITS = {"seconds": 120, "bytes": 2 * GIB}
RUNNER = """
import sys, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3",
               resources={"metadata": {"path": str(__import__('pathlib').Path(path).parent)}}).execute()
"""


def run(cmd: list[str], env: dict, cwd: Path) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(cmd, env=env, cwd=cwd, check=True)


def copy_repository(dest: Path) -> Path:
    """The files git tracks, as they are in the working tree (what a clone of this state would hold)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def private_env(home: Path, venv: Path) -> dict:
    """A HOME and Jupyter directories of its own, and the environment's bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "VIRTUAL_ENV", "PYTHON"))}
    for var, sub in (("HOME", "home"), ("JUPYTER_CONFIG_DIR", "jupyter-config"),
                     ("JUPYTER_DATA_DIR", "jupyter-data"), ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"),
                     ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
                     ("JUPYTERLAB_SETTINGS_DIR", "lab-settings")):
        (home / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(home / sub)
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def build(repo: Path, venv: Path, env: dict) -> float:
    """repo2docker's steps: a venv, binder/requirements.txt, binder/postBuild. Returns seconds."""
    wanted = (repo / "binder" / "runtime.txt").read_text().strip().removeprefix("python-")
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if wanted != have:
        raise SystemExit(f"binder/runtime.txt asks for Python {wanted}; run this script with Python {wanted} "
                         f"(this is {have})")
    start = time.perf_counter()
    run([sys.executable, "-m", "venv", str(venv)], env, repo)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir", "--quiet", "-r",
         "binder/requirements.txt"], env, repo)
    run(["bash", "binder/postBuild"], env, repo)
    return time.perf_counter() - start


def tree_pss(root: psutil.Process) -> int:
    """Bytes of memory the process tree under ``root`` holds, as the sum of each process's PSS."""
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def run_notebook(path: Path, venv: Path, env: dict, core: int) -> dict:
    """Run one notebook in the environment on one core; its seconds, peak bytes and outcome."""
    cmd = ["taskset", "-c", str(core), str(venv / "bin" / "python"), "-c", RUNNER, str(path)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=path.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    peak = [0]

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak[0] = max(peak[0], tree_pss(root))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output, _ = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        sampler.join()
    seconds = time.perf_counter() - start
    failed = proc.returncode != 0
    return {"notebook": path.stem, "seconds": round(seconds, 1), "peak_bytes": peak[0], "ok": not failed,
            "error": output[-1500:] if failed else ""}


def table(rows: list[dict]) -> str:
    lines = ["| notebook | seconds on one core | peak memory (GiB, PSS of all its processes) "
             "| within 2 min and 2 GiB |",
             "|---|---:|---:|---|"]
    for r in rows:
        fits = r["ok"] and r["seconds"] <= LIMITS["seconds"] and r["peak_bytes"] <= LIMITS["bytes"]
        lines.append(f"| {r['notebook']} | {r['seconds']:.0f} | {r['peak_bytes'] / GIB:.2f} | "
                     f"{'yes' if fits else 'NO' + ('' if r['ok'] else ' (failed)')} |")
    return "\n".join(lines)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--env", help="the environment's directory: built there if missing, kept after")
    parser.add_argument("--only", nargs="*", help="notebook names (stems) to run; default: all")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each notebook (the largest peak is kept)")
    parser.add_argument("--core", type=int, default=0, help="the CPU the notebooks run on")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    if shutil.which("taskset") is None:
        raise SystemExit("taskset (util-linux) is needed to hold the notebooks to one core")

    scratch = Path(tempfile.mkdtemp(prefix="paralab-binder-"))
    try:
        repo = copy_repository(scratch / "repo")
        venv = Path(args.env).resolve() if args.env else scratch / "env"
        env = private_env(scratch, venv)
        if (venv / "bin" / "python").exists():
            print(f"reusing the environment in {venv}; running postBuild for this copy of the repository")
            run(["bash", "binder/postBuild"], env, repo)
        else:
            print(f"built in {build(repo, venv, env):.0f} s")
        notebooks = sorted((repo / "notebooks").glob("[0-9][0-9]_*.ipynb"))
        if args.only:
            notebooks = [p for p in notebooks if p.stem in args.only]
        rows = []
        for path in notebooks:
            runs = [run_notebook(path, venv, env, args.core) for _ in range(args.repeats)]
            worst = max(runs, key=lambda r: (not r["ok"], r["peak_bytes"]))
            worst["seconds"] = max(r["seconds"] for r in runs)
            rows.append(worst)
            print(f"{path.stem}: {worst['seconds']:.0f} s, peak {worst['peak_bytes'] / GIB:.2f} GiB"
                  + ("" if worst["ok"] else f"  FAILED\n{worst['error']}"), flush=True)
        print()
        print(table(rows))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
