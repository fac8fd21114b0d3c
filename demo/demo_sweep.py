"""Demo parameter sweep: a classic array job on classic.q, some of whose runs go wrong.

The first half of the source article's second run, at small scale. Each task
integrates a damped harmonic oscillator, ``x'' + 2*zeta*omega*x' + omega^2*x = 0``
with ``omega = sqrt(k/m)``, by symplectic Euler, from x=1, v=0, and writes its
run log to ``OUT/run-<task>.txt``. Task N takes :data:`PARAMETER_SETS` [(N-1) mod 8]:

- stable steps (omega*dt well under 2): the energy decays; ``status=ok``;
- omega*dt above 2: symplectic Euler is unstable, the amplitude grows until it
  overflows; the run stops at the first non-finite value and says
  ``status=diverged`` (and exits 0, as silently wrong runs do);
- ``m = 0``: ``omega`` divides by zero; the exception is caught, logged as
  ``status=crashed`` with its traceback, and the task exits 1;
- ``abort_at``: the process aborts (SIGABRT) mid-run, as a segfaulting code
  would: the log just stops, with no summary and no word of what happened.

Run: ``python -m demo.demo_sweep --out DIR [--task N]`` (default: Grid
Engine's ``SGE_TASK_ID``). Standard library only.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import traceback

PARAMETER_SETS = (
    {"k": 1.0, "m": 1.0, "zeta": 0.05, "dt": 0.01, "steps": 4000},
    {"k": 4.0, "m": 1.0, "zeta": 0.10, "dt": 0.05, "steps": 2000},
    {"k": 1.0, "m": 1.0, "zeta": 0.00, "dt": 2.50, "steps": 2000},
    {"k": 9.0, "m": 1.0, "zeta": 0.20, "dt": 0.02, "steps": 2000},
    {"k": 1.0, "m": 0.0, "zeta": 0.05, "dt": 0.01, "steps": 2000},
    {"k": 25.0, "m": 1.0, "zeta": 0.01, "dt": 0.50, "steps": 2000},
    {"k": 0.25, "m": 1.0, "zeta": 0.30, "dt": 0.10, "steps": 2000},
    {"k": 1.0, "m": 1.0, "zeta": 0.05, "dt": 0.01, "steps": 4000, "abort_at": 1500},
)
SAMPLE_EVERY = 250


def parameters(task: int) -> dict:
    """The parameter set of task ``task`` (1-based, cycling through the eight)."""
    return dict(PARAMETER_SETS[(task - 1) % len(PARAMETER_SETS)])


def simulate(params: dict, log) -> str:
    """Integrate and log; returns ``ok`` or ``diverged``. Raises on bad parameters."""
    omega = math.sqrt(params["k"] / params["m"])
    zeta, dt = params["zeta"], params["dt"]
    x, v = 1.0, 0.0
    energy0 = 0.5 * omega * omega
    for step in range(1, params["steps"] + 1):
        v += dt * (-2.0 * zeta * omega * v - omega * omega * x)
        x += dt * v
        if step == params.get("abort_at"):
            log.flush()
            os.abort()
        energy = 0.5 * v * v + 0.5 * omega * omega * x * x
        if not (math.isfinite(x) and math.isfinite(v) and math.isfinite(energy)):
            log.write(f"t={step * dt:.4f} x={x} v={v} energy={energy}\n")
            log.write(f"summary: status=diverged step={step} (non-finite state)\n")
            return "diverged"
        if step % SAMPLE_EVERY == 0:
            log.write(f"t={step * dt:.4f} x={x:.6e} v={v:.6e} energy={energy:.6e}\n")
    log.write(f"summary: status=ok final_energy={energy:.6e} energy_ratio={energy / energy0:.6e}\n")
    return "ok"


def main(argv: list[str] | None = None) -> int:
    """Entry point (``python -m demo.demo_sweep --out DIR [--task N]``): write one sweep run's
    log; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m demo.demo_sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for run-<task>.txt")
    parser.add_argument("--task", type=int, default=None, help="task number (default: $SGE_TASK_ID)")
    args = parser.parse_args(argv)
    task = args.task
    if task is None:
        from_env = os.environ.get("SGE_TASK_ID", "")
        task = int(from_env) if from_env.isdigit() else 1
    params = parameters(task)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"run-{task}.txt")
    with open(path, "w", encoding="utf-8") as log:
        shown = " ".join(f"{k}={v}" for k, v in params.items() if k != "abort_at")
        log.write(f"# tco demo sweep: damped oscillator, symplectic Euler; run {task} "
                  f"(job {os.environ.get('JOB_ID', '-')})\nparams: {shown}\n")
        try:
            simulate(params, log)
        except Exception as exc:  # noqa: BLE001 - the crash is the run's result
            log.write("".join(traceback.format_exception(exc)))
            log.write(f"summary: status=crashed ({type(exc).__name__}: {exc})\n")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
