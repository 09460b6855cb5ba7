"""lrl beside TRL's GRPOTrainer on the same job and at the same temperature: episodes a second, and their ratio.

    pip install -r requirements/trl.txt                 # TRL itself (the bench says so and stops without it)
    python bench/bench_vs_trl.py                        # SmolLM2-135M-Instruct, 3 runs of 1 warm-up + 6 steps each
    python bench/bench_vs_trl.py --runs 1 --steps 4 --threads 2 --lr 1e-5

The job, the same on both sides: the calc tasks as one turn (bench/plugins/calc_one_turn.py: the calc system message and
problems, a right answer or a right calculator call scores 1), SmolLM2-135M-Instruct as lrl converts it, 4
problems x 8 samples a step, at most 24 new tokens, the same sampling temperature (``--temperature``, 1 by default; no
top-k, no top-p; each side reports the temperature it sampled at and the bench stops if either differs), bf16
autocast where the CPU has native bf16 (fp32 weights and optimizer on both sides), no KL term, one update a step,
the same learning rate and gradient clip. Each trainer runs in a process of its own, both loaded at once; their
steps take turns (TRL's step, then lrl's, then TRL's...), so a change in the machine's load falls on both. A step
is timed from its start (before the batch is sampled) to the end of its update. ``--runs`` repeats the whole
comparison with fresh processes (seeds seed, seed + 1, ...).

lrl leaves out of its update the rows that cannot move the weights (a group whose rewards are all equal has
advantage 0 on every row) and skips a step where no row is left; TRL computes every row. So lrl is reported in
two regimes: the steps where every row trained (the same work as TRL's step), and all steps that trained, with
the share of rows it left out; a skipped step is listed apart. Per run: the median step of each regime and its
episodes/s (32 / median); over the runs: the median ratio lrl / TRL with its range, and the commit. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "plugins"))

from lrl.cli import OneLineParser  # noqa: E402
from lrl.options import MAX_INT  # noqa: E402

INSTALL = "pip install -r requirements/trl.txt"
EPISODES = 32  # 4 problems x 8 samples


def trl_missing() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return True
    return False


# -- the two workers (each in a process of its own; a step starts when the bench says so) --------------------
def trl_worker(conn, args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from calc_one_turn import REPLY_TOKENS, one_turn_reward
    from datasets import Dataset
    from step_gate import Gate
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lrl.envs.calc import make_calc_tasks
    from lrl.precision import native_bf16

    gate = Gate(conn)
    tasks = make_calc_tasks("train")
    rows = [{"prompt": messages(t.prompt), "answer": float(t.answer)} for t in tasks]

    def reward(completions, answer, completion_ids, **kw):
        scores = [one_turn_reward(c[0]["content"], a) for c, a in zip(completions, answer)]
        gate.info.update(tokens=sum(len(ids) for ids in completion_ids), reward=sum(scores) / len(scores))
        return scores

    class Steps(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            gate.begin()

        def on_step_end(self, args, *a, **kw):
            gate.end(trained=True, temperature=float(args.temperature), rows=EPISODES, trained_rows=EPISODES)

    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    out = tempfile.TemporaryDirectory(prefix="lrl-bench-trl-")  # TRL's output folder, removed after the run
    config = GRPOConfig(
        output_dir=out.name,
        per_device_train_batch_size=EPISODES,
        gradient_accumulation_steps=1,
        num_generations=8,
        num_iterations=1,
        max_completion_length=REPLY_TOKENS,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        learning_rate=args.lr,
        max_grad_norm=1.0,
        bf16=native_bf16("cpu"),
        use_cpu=True,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=args.seed,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Steps()],
    )
    try:
        trainer.train()
    finally:
        out.cleanup()
    conn.send(("finished",))


def messages(problem: str) -> list[dict]:
    from lrl.envs.calc import INSTRUCTIONS

    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": problem}]


def lrl_worker(conn, args) -> None:
    import lightning as L
    from step_gate import Gate

    from lrl.arguments import parse_args
    from lrl.run import build_run

    gate = Gate(conn)

    class Steps(L.Callback):
        def on_train_batch_start(self, *a, **kw):
            gate.begin()

        def on_train_batch_end(self, trainer, module, *a, **kw):
            h = module.history[-1]
            tokens = h["train/action_tokens"] * EPISODES  # the mean an episode, times the episodes
            batch = module.last_step.batch
            acting = batch["action_mask"].bool().any(-1)
            trained = int((acting & batch["advantage"].ne(0)).sum()) if not h["train/skipped"] else 0
            gate.end(trained=not h["train/skipped"], tokens=tokens, reward=h["train/reward"],
                     temperature=float(module.cfg.sampling.temperature), rows=int(acting.sum()),
                     trained_rows=trained)  # fmt: skip

    flags = [
        "--env", "calc1", "--plugins", "calc_one_turn", "--model", args.model_dir, "--tasks-per-step", "4",
        "--episodes-per-task", "8", "--minibatches", "1", "--lr", str(args.lr), "--max-grad-norm", "1.0",
        "--max-steps", str(args.warmup + args.steps), "--eval-at-start", "false", "--eval-every", "1000000",
        "--temperature", str(args.temperature),
        "--progress", "false", "--threads", str(args.threads), "--seed", str(args.seed),
    ]  # fmt: skip
    run = build_run(parse_args(flags), callbacks=[Steps()], logger=False)
    run.trainer.fit(run.module, run.datamodule)
    conn.send(("finished",))


# -- the bench -----------------------------------------------------------------------------------------------
def same_prompt_tokens(model_dir: str) -> bool:
    """Whether TRL's rendering of a problem (the tokenizer's chat template) is lrl's, token for token."""
    from transformers import AutoTokenizer

    from lrl.envs.calc import INSTRUCTIONS, make_calc_tasks
    from lrl.tokenizers import load_tokenizer

    task = make_calc_tasks("train")[0]
    hf = AutoTokenizer.from_pretrained(model_dir)
    theirs = hf.apply_chat_template(messages(task.prompt), add_generation_prompt=True, tokenize=True)
    theirs = list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs)
    ours = load_tokenizer(model_dir).conversation(INSTRUCTIONS).prompt(task.prompt)
    return theirs == ours


def main(argv=None) -> int:
    p = OneLineParser(prog="bench_vs_trl.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a named model or a save_pretrained folder")
    p.add_argument("--steps", type=int, default=6, help="measured steps of each trainer (after the warm-up)")
    p.add_argument(
        "--runs", type=int, default=3, help="comparisons, each with fresh processes (seeds seed, seed + 1...)"
    )
    p.add_argument("--temperature", type=float, default=1.0, help="the sampling temperature of both sides")
    p.add_argument("--warmup", type=int, default=1, help="steps of each trainer before the measured ones")
    p.add_argument("--threads", type=int, default=2, help="torch threads of each trainer")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.threads < 1 or args.runs < 1 or args.warmup < 0:
        p.error("--steps, --runs and --threads must be at least 1, --warmup at least 0")
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        p.error(f"--temperature must be a finite number above 0 (got {args.temperature:g})")
    if not (math.isfinite(args.lr) and args.lr > 0) or not 0 <= args.seed <= MAX_INT:
        p.error(
            f"--lr must be a finite number above 0 (got {args.lr:g}), --seed in [0, {MAX_INT}] (got {args.seed})"
        )
    from bench_real_model import machine, model_problem

    if problem := model_problem(args.model):
        p.error(problem)
    if trl_missing():
        print(f"bench_vs_trl: TRL is not installed; {INSTALL}")
        return 0
    from lrl.models import resolve_model

    try:
        args.model_dir = str(resolve_model(args.model)) if not Path(args.model).is_dir() else args.model
    except ValueError as err:  # the named model's wheel is not installed
        p.error(f"--model: {err}")
    import torch

    torch.set_num_threads(args.threads)
    print(f"machine: {machine()}")
    import trl

    print(
        f"TRL {trl.__version__}; the same prompt tokens on both sides: {same_prompt_tokens(args.model_dir)}"
    )
    print(f"commit: {commit()}; {args.runs} runs of {args.warmup} warm-up + {args.steps} measured steps a side, "
          f"temperature {args.temperature:g} on both")  # fmt: skip
    runs = []
    for run in range(args.runs):
        print(f"\nrun {run + 1} of {args.runs} (seed {args.seed + run})")
        steps = compare(argparse.Namespace(**{**vars(args), "seed": args.seed + run}))
        for name, rows in steps.items():
            seen = {i.get("temperature") for _, i in rows}
            if seen != {args.temperature}:
                print(
                    f"bench_vs_trl: {name} sampled at temperature {sorted(map(str, seen))}, not {args.temperature:g}"
                )
                return 1
        runs.append(report(steps, args.warmup))
    summary(runs)
    return 0


def commit() -> str:
    """HEAD's short id, with '+ changes' where the work tree differs from it ('?' outside a git checkout)."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + (" + changes" if dirty else "")


def compare(args) -> dict[str, list[tuple[float, dict]]]:
    """One comparison: both workers started, their steps taking turns -> each side's (seconds, info) per step."""
    ctx = mp.get_context("spawn")
    workers = {}
    for name, fn in (("TRL", trl_worker), ("lrl", lrl_worker)):
        here, there = ctx.Pipe()
        proc = ctx.Process(target=fn, args=(there, args), daemon=True)
        proc.start()
        workers[name] = (proc, here)
    steps: dict[str, list[tuple[float, dict]]] = {name: [] for name in workers}
    try:
        for i in range(args.warmup + args.steps):
            for name, (proc, conn) in workers.items():
                message = receive(conn, proc, name)
                if message[0] != "ready":
                    raise RuntimeError(f"{name} ended before step {i}: {message}")
                conn.send("go")
                _, seconds, info = receive(conn, proc, name)
                steps[name].append((seconds, info))
                phase = "warm-up" if i < args.warmup else "measured"
                rows = f"{info.get('trained_rows', 0)}/{info.get('rows', 0)} rows trained"
                print(f"step {i} {name:<4} {seconds:6.1f} s  reward {info.get('reward', float('nan')):.3f}  "
                      f"tokens {info.get('tokens', 0):5.0f}  {rows:<18} T {info.get('temperature', float('nan')):g}  "
                      f"({phase})", flush=True)  # fmt: skip
    finally:
        for proc, _ in workers.values():
            proc.terminate()
            proc.join(10)
    return steps


def receive(conn, proc, name: str):
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise RuntimeError(f"the {name} worker died (exit {proc.exitcode})")
    return conn.recv()


def report(steps: dict, warmup: int) -> dict[str, float]:
    """One run's medians, printed -> its episodes/s: TRL's, lrl's on steps where every row trained ('full'), and on
    all steps that trained ('trained'); a regime with no step is left out."""
    rates: dict[str, float] = {}
    for name, rows in steps.items():
        measured = rows[warmup:]
        trained = [(s, i) for s, i in measured if i.get("trained")]
        skipped = [s for s, i in measured if not i.get("trained")]
        regimes = {"TRL": trained} if name == "TRL" else {
            "lrl full": [(s, i) for s, i in trained if i.get("trained_rows") == i.get("rows")],
            "lrl trained": trained,
        }  # fmt: skip
        for label, chosen in regimes.items():
            if not chosen:
                print(f"{label:<11} no measured step")
                continue
            median = statistics.median(s for s, _ in chosen)
            rates[label] = EPISODES / median
            left = sum(i.get("rows", 0) - i.get("trained_rows", 0) for _, i in chosen)
            share = left / max(sum(i.get("rows", 0) for _, i in chosen), 1)
            print(f"{label:<11} median step {median:6.2f} s over {len(chosen)} steps: {rates[label]:.2f} episodes/s"
                  f" ({share:.0%} of their rows left out)")  # fmt: skip
        if skipped:
            print(
                f"{'':<11} {len(skipped)} step(s) skipped for want of signal (median {statistics.median(skipped):.1f} s)"
            )
    for label in ("lrl full", "lrl trained"):
        if label in rates and "TRL" in rates:
            print(f"{label} / TRL: {rates[label] / rates['TRL']:.2f}x episodes/s")
    return rates


def summary(runs: list[dict[str, float]]) -> None:
    """The ratios over the runs: median and range, and on how many runs each stands."""
    print(f"\nover {len(runs)} run(s):")
    for label in ("lrl full", "lrl trained"):
        ratios = sorted(r[label] / r["TRL"] for r in runs if label in r and "TRL" in r)
        if not ratios:
            print(f"  {label} / TRL: no run had such a step")
            continue
        print(f"  {label} / TRL: median {statistics.median(ratios):.2f}x episodes/s, range {ratios[0]:.2f}-"
              f"{ratios[-1]:.2f}x over {len(ratios)} run(s)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
