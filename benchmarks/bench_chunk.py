"""Inference chunk size on this machine's CPU, one process: the sensor and text pools.

The engine runs every no-grad forward (teacher inference, evaluation, prototypes) in chunks of
``hfl_bench.training.inference_chunk(x)`` samples. For each member of the ``sensor`` pool (on
HAPT's 6 x 128 windows) and the ``text`` pool (on Rotten Tomatoes' 48 token ids, lengths drawn
from 5 to 47 words, the rest padding) it times the logits of ``--n`` samples at the engine's
chunk and at fixed chunks from 32 to 4,096, checks that every chunk gives the same logits bit for
bit as one call over all samples (eval-mode rows do not depend on each other), and writes the
medians with each chunk's speed against the engine's: ``benchmarks/results/chunk-<device>.json``.

With ``--method M --rounds R`` it also runs M on the prepared ``rotten-tomatoes`` task (seed 0,
its defaults) for 1 + R rounds twice in this process, with token ids counted as one input value each
(``CPU_TOKEN_WIDTH = 1``, the rule before 2026-12-07) and at the engine's width, and reports the
process CPU seconds of each run's last R rounds and whether every client's model ends equal bit for bit.

    OMP_NUM_THREADS=1 python benchmarks/bench_chunk.py [--n 4096] [--repeats 5] [--tag after]
    HFL_BENCH_DATA=... OMP_NUM_THREADS=1 python benchmarks/bench_chunk.py --method crad --rounds 2
    python benchmarks/bench_chunk.py --table benchmarks/results/chunk-cpu.json   # the study's table
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from hfl_bench.data import TaskInfo, get_task
from hfl_bench.pools import build_model, get_pool
from hfl_bench.training import inference_chunk, predict_logits

CHUNKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)


def sensor_input(n: int, gen: torch.Generator) -> tuple[TaskInfo, torch.Tensor]:
    info = get_task("hapt").info  # the task's shape and classes; its data is not needed
    return info, torch.randn(n, *info.input_shape, generator=gen)


def text_input(n: int, gen: torch.Generator) -> tuple[TaskInfo, torch.Tensor]:
    info = get_task("rotten-tomatoes").info
    length = info.input_shape[-1]
    ids = torch.randint(2, 10_000, (n, length), generator=gen)
    words = torch.randint(5, length, (n, 1), generator=gen)
    ids[torch.arange(length) >= words] = 0  # padding after each review's words
    return info, ids.view(n, *info.input_shape)


def timed(fn, repeats: int) -> float:
    fn()  # warm-up (allocations, oneDNN primitive creation)
    times = []
    for _ in range(repeats):
        t = time.process_time()  # CPU time: other processes on the machine do not count
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def whole_runs(method: str, rounds: int) -> dict:
    """``method`` on rotten-tomatoes for ``rounds`` rounds at token width 1 and at the engine's."""
    from hfl_bench import engine, training
    from hfl_bench.config import RunConfig

    width, runs = training.CPU_TOKEN_WIDTH, {}
    try:
        for label, w in (("ids as one value", 1), ("engine", width)):
            training.CPU_TOKEN_WIDTH = w
            with tempfile.TemporaryDirectory() as out:
                cfg = engine.load_task(RunConfig(method=method, task="rotten-tomatoes", seed=0, out=out))[1]
                sim = engine.Simulation(cfg)
                sim.step(1)  # not timed: the first round creates the kernels' primitives
                start = time.process_time()
                for rnd in range(2, rounds + 2):
                    sim.step(rnd)
                seconds = time.process_time() - start
                runs[label] = (seconds, [t.detach().clone() for c in sim.fed.clients
                                         for t in c.model.state_dict().values()])
                sim.close()
            print(f"{method} on rotten-tomatoes, {label}: {seconds / rounds:.1f} CPU s a round", flush=True)
    finally:
        training.CPU_TOKEN_WIDTH = width
    (before, a), (after, b) = runs["ids as one value"], runs["engine"]
    same = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    print(f"{method}: x{before / after:.2f} faster; every client's model equal bit for bit: {same}")
    return {"method": method, "task": "rotten-tomatoes", "rounds": rounds, "seed": 0,
            "cpu_s_per_round_ids_as_one_value": round(before / rounds, 2),
            "cpu_s_per_round_engine": round(after / rounds, 2), "speed_vs_before": round(before / after, 3),
            "models_bit_identical": same}


def table(report: dict) -> str:
    """The performance study's table (markdown) from a result file."""
    lines = ["| pool | model | engine's chunk | samples / CPU s at it | at 4,096 | fastest chunk measured | "
             "chunks whose logits differ from one call's |", "|---|---|---|---|---|---|---|"]
    models = {}
    for row in report["rows"]:
        models.setdefault((row["pool"], row["model"]), []).append(row)
    for (pool, model), rows in models.items():
        engine = next(r for r in rows if r["engine_chunk"])
        at_4096 = next(r for r in rows if r["chunk"] == 4096)
        best = max(rows, key=lambda r: r["samples_per_cpu_s"])
        differ = ", ".join(str(r["chunk"]) for r in rows if not r["bit_identical_to_one_call"]) or "none"
        lines.append(f"| {pool} | {model} | {engine['chunk']} | {engine['samples_per_cpu_s']:,} | "
                     f"{at_4096['samples_per_cpu_s']:,} | {best['chunk']} ({best['samples_per_cpu_s']:,}) | {differ} |")
    run = report.get("whole_runs")
    if run:
        lines += ["", f"{run['method']} on {run['task']}, seed {run['seed']}, {run['rounds']} rounds after an untimed "
                      f"one: {run['cpu_s_per_round_ids_as_one_value']} CPU s a round with token ids counted as one "
                      f"value, {run['cpu_s_per_round_engine']} at the engine's width (x{run['speed_vs_before']:.2f}); "
                      f"every client's model equal bit for bit: {'yes' if run['models_bit_identical'] else 'no'}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="samples per timing")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tag", default="", help="suffix of the result file (before / after a change)")
    ap.add_argument("--method", help="also time whole rounds of this method on rotten-tomatoes (prepared)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds of each --method run (after one untimed)")
    ap.add_argument("--table", type=Path, help="print the study's table from this result file and exit")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())), end="")
        return
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for pool, make in (("sensor", sensor_input), ("text", text_input)):
        info, x = make(args.n, gen)
        engine = inference_chunk(x)
        for member in get_pool(pool).members:
            model = build_model(member, info).eval()
            whole = predict_logits(model, x, chunk=len(x))
            base = timed(lambda: predict_logits(model, x), args.repeats)
            for chunk in sorted({*CHUNKS, engine}):
                sec = base if chunk == engine else timed(lambda c=chunk: predict_logits(model, x, chunk=c),
                                                         args.repeats)
                same = torch.equal(predict_logits(model, x, chunk=chunk), whole)
                rows.append({"pool": pool, "model": member.name, "chunk": chunk, "engine_chunk": chunk == engine,
                             "samples_per_cpu_s": round(args.n / sec), "speed_vs_engine": round(base / sec, 3),
                             "bit_identical_to_one_call": same})
                mark = " (engine)" if chunk == engine else ""
                print(f"{pool:6s} {member.name:12s} chunk {chunk:5d}{mark:9s} {args.n / sec:9.0f} samples/CPU s  "
                      f"x{base / sec:.2f}  identical: {same}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    suffix = f"-{args.tag}" if args.tag else ""
    out = Path(__file__).parent / "results" / f"chunk-cpu{suffix}.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({
        "what": "inference chunk size, sensor and text pools: medians of process CPU time, one process",
        "commit": commit, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "platform": platform.platform(), "processor": platform.processor(), "n": args.n,
        "repeats": args.repeats, "rows": rows,
        **({"whole_runs": whole_runs(args.method, args.rounds)} if args.method else {})}, indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {out.name}")


if __name__ == "__main__":
    main()
